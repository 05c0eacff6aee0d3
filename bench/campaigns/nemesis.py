"""Nemesis campaign: the controller in the loop, with the API server, KubeRay, Ray and S3 all real,
each trial a TrainingRun hit by faults at random moments, then judged by a history checker.

Where it runs: the kwok test bed (testbed/cluster.py: a real kube-apiserver and etcd, the real
KubeRay operator, kwok nodes) with the real controller as a process (as the chart's Deployment runs
it, with a ServiceAccount's token, so the API server's audit log holds every request it made), a
real Ray head on loopback for each attempt's RayCluster (started when its RayJob appears, reached
through the Ray bridge: a new cluster per attempt, as KubeRay makes), and a real S3 server
(SeaweedFS) behind a fault proxy (bench/campaigns/fault_proxy.py) that the controller and the jobs reach. The
job is the real GPT-2 example (Ray Train, the Hugging Face Trainer, the S3 checkpoint callback),
made small and paced (``Pace``: ``CAMPAIGN_PACE.steps`` steps of at least ``step_seconds`` each, a
checkpoint every ``every``), so that a trial's second fault still finds the job training after the
first one, held for up to 45 s, is over.

Faults (``KINDS``), one or two per trial, each fired at a drawn step, right after a drawn checkpoint
save (its upload in flight), or a drawn number of seconds into an attempt's start-up:
- the controller SIGKILLed, or SIGSTOPped for longer than its timeouts (``controller-kill``,
  ``controller-pause``); a stand-in for the kubelet's liveness probe (the chart's: 3 failures 20 s
  apart) restarts a controller that stops answering /healthz;
- the API server SIGKILLed and started again, or SIGSTOPped (accepting and never answering);
- S3 refusing connections, silent, or answering 500 for a while (the proxy);
- the KubeRay operator SIGKILLed and started again;
- the attempt's spot node lost (pods marked DisruptionTarget, node and pods deleted, the job's
  processes killed), with the controller up or SIGKILLed first and started only after the RayJob
  failed (``node-lost``, ``node-lost-controller-down``);
- the attempt's RayJob deleted; the job's driver SIGKILLed; a spot notice (the driver's SIGTERM, as
  the preStop drain gives it: an emergency checkpoint, then exit 143);
- a user action: the run suspended (``spec.suspend: true``) and resumed 1-10 s after it says
  Suspended (``user-suspend``).

A node lost takes every attempt with a pod on it (``--parallel`` trials share the spot nodes); each
of those attempts gets a landing of its own.

The history checker (``judge``) reads what happened: the TrainingRun's status as it was polled
(every second), the API server's audit log, the RayJobs seen, the job's event log and sample log,
and asserts for each trial:
- the run Succeeded, with every step asked, and its last checkpoint at the last step;
- every attempt judged once: numbers 1..n, each RayJob name created once, an outcome never changed
  once given, budgets never going down;
- each attempt's outcome is one its fault allows (``KindOfFault.judged``), and an attempt no run fault
  hit Succeeded or was Interrupted by an infrastructure fault (nothing spent); so the preemptions
  and failures counted are the faults that should count;
- every restart resumed from the newest checkpoint complete when it was hit (from the emergency
  checkpoint after a notice), and every step trained the uninterrupted run's batch.
Each landing records the attempt, the step, and what the store held (a checkpoint being written,
its manifest not yet there: the window every commit protocol must survive). A trial that fails
keeps its directory (the controller's log, the run's status history, the job's events).

Result: bench/results/nemesis.json (ratio: trials that kept every promise / trials; goal 1.0).

    .venv/bin/python -m bench.campaigns.nemesis --trials 200 --parallel 3     # make nemesis
    .venv/bin/python -m bench.campaigns.nemesis --trials 4 --seed 7           # a few
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

import testbed.cluster as tb
from bench.campaigns.chaos_runs import restarts
from bench.campaigns.fault_proxy import FaultProxy, fault
from bench.common import RESULTS_DIR, ROOT, current_commit, machine_details, write_result
from spotray.contract.attempts import EXIT_FAILED, EXIT_NOT_FOUND
from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV
from spotray.contract.names import (
    ATTEMPT_LABEL,
    CHECKPOINT_KEY_SECRET_DATA_KEY,
    DEFAULT_CHECKPOINT_KEY_SECRET,
    GROUP,
    PLURAL,
    RUN_LABEL,
    S3_OPT_IN_LABEL,
    TERMINAL_PHASES,
    VERSION,
    rayjob_name,
)
from spotray.contract.uris import parse_uri
from spotray.local.local_run import EventCursor
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME, checkpoint_dir_name, parse_checkpoint_step
from spotray.train.hf.data import trained_batches
from spotray.train.storage.local_s3 import LocalS3Server, free_ports
from spotray.train.storage.store import RetryPolicy, S3ObjectStore

BATCH = 4
BUCKET = "nemesis"
SECRET = "s3-credentials"  # noqa: S105 - the Secret's name, not a password
ACCOUNT = "spotray-controller"
TRIAL_TIMEOUT_S = 900.0
POLL_S = 1.0  # the run's status and RayJobs, from the API server
EVENTS_POLL_S = 0.1  # the job's event log: a fault "right after a save" must land while the upload runs
CRD = ROOT / "charts" / "spotray" / "crds" / "trainingruns.spotray.dev.yaml"
# The chart's livenessProbe: /healthz every 20 s, 3 failures in a row restart the container.
LIVENESS_PERIOD_S, LIVENESS_FAILURES = 20.0, 3

SUCCEEDED_ = ("Succeeded", "TrainingFinished")
INTERRUPTED = ("Interrupted", "InfrastructureFault")


@dataclass(frozen=True)
class Pace:
    """How a trial's job trains, and where its faults may land."""

    steps: int
    every: int  # steps between checkpoints
    # Each step at least this long (the job's --min-step-seconds): the tiny model trains a step in
    # about 10 ms, so unpaced a fault drawn for a step lands after the run, and a second fault finds
    # the job done once the first is over.
    step_seconds: float
    # The S3 upload link (bench/campaigns/fault_proxy.py), None for loopback speed. The tiny model's checkpoint
    # (about 0.3 MB) uploads in milliseconds on loopback, so a fault fired right after a save found
    # the checkpoint already complete; over a link this slow its upload lasts seconds, as a real
    # model's does over a real link, and the fault lands while its files are written.
    upload_bytes_per_s: float | None = None

    def steps_for(self, order: int, count: int) -> range:
        """The steps where the ``order``-th of ``count`` faults may land: one anywhere before the last
        two steps; of two, the first in the first third and the second from halfway on."""
        late = self.steps - 2
        if count == 1:
            return range(2, late)
        return range(2, self.steps // 3 + 1) if order == 0 else range(self.steps // 2, late)

    def saves_for(self, order: int, count: int) -> list[int]:
        """The checkpoint saves after which the ``order``-th of ``count`` faults may land."""
        return [step for step in self.steps_for(order, count) if step % self.every == 0]


# Two minutes of training: a first fault fired by step 20 (40 s in) and held for the longest 45 s
# is over by step 43, before the second fault's last save (50) is due.
CAMPAIGN_PACE = Pace(steps=60, every=10, step_seconds=2.0, upload_bytes_per_s=100_000)


@dataclass(frozen=True)
class KindOfFault:
    scope: str  # "cluster": whatever runs at the moment; "run": the attempt it lands on
    judged: tuple[tuple[str, str], ...]  # (outcome, reason) the attempt it lands on may get
    text: str
    held_s: tuple[float, float] = (0.0, 0.0)  # a cluster fault holds its part down this long (drawn between)
    # A notice (the driver's SIGTERM, a node drained): the steps left in the last interval may take
    # less time than the drain, so the job may finish first (``late_from``).
    notice: bool = False
    # Whether the attempt it lands on ends (every fault but a user's edit or pull): a second fault
    # triggered by an attempt's start-up then waits for the next attempt (``draw_faults``).
    ends_attempt: bool = True


KINDS: dict[str, KindOfFault] = {
    "controller-kill": KindOfFault("cluster", (), "the controller SIGKILLed, started again 0-5 s later", (0, 5)),
    "controller-pause": KindOfFault(
        "cluster", (), "the controller SIGSTOPped 20-45 s (its timeouts are 5-15 s)", (20, 45)
    ),
    "apiserver-kill": KindOfFault("cluster", (), "kube-apiserver SIGKILLed, started again 2-10 s later", (2, 10)),
    "apiserver-silent": KindOfFault(
        "cluster", (), "kube-apiserver SIGSTOPped 10-30 s: connections accepted, no answer", (10, 30)
    ),
    "s3-refuse": KindOfFault("cluster", (), "S3 refusing connections for 5-30 s", (5, 30)),
    "s3-silent": KindOfFault("cluster", (), "S3 accepting and never answering for 5-30 s", (5, 30)),
    "s3-500": KindOfFault("cluster", (), "S3 answering 500 InternalError for 5-30 s", (5, 30)),
    "kuberay-restart": KindOfFault("cluster", (), "the KubeRay operator SIGKILLed, started again 0-5 s later", (0, 5)),
    "node-lost": KindOfFault("run", (("Preempted", "NodeLost"),), "the attempt's spot node lost"),
    "node-lost-controller-down": KindOfFault(
        "run", (("Preempted", "NodeLost"),), "the spot node lost while the controller is down"
    ),
    # Deleting a RayJob stops its Ray job (KubeRay's finalizer): a driver that had time for its
    # emergency checkpoint recorded a notice, one that had not left no record.
    "rayjob-deleted": KindOfFault(
        "run", (("Interrupted", "RayJobGone"), ("Preempted", "SpotNotice")), "the attempt's RayJob deleted"
    ),
    "driver-killed": KindOfFault("run", (("Failed", "TrainingFailed"),), "the job's driver SIGKILLed"),
    "spot-notice": KindOfFault(
        "run", (("Preempted", "SpotNotice"),), "the driver's SIGTERM (a spot notice)", notice=True
    ),
    # A user action (issue #69): spec.suspend true, then false 1-10 s after the run says Suspended and its
    # RayJob is gone. Nothing is spent; the next attempt resumes from the newest complete checkpoint.
    "user-suspend": KindOfFault(
        "run", (("Suspended", "Suspended"),), "the user suspends the run, then resumes it", (1, 10)
    ),
    # The run deleted and applied again (the same manifest, or under another name on the same URI):
    # its attempt is judged by nobody (its run is gone); the run created again is judged as a whole,
    # its first attempt resuming from the newest complete checkpoint.
    "user-recreate": KindOfFault("run", (), "the user deletes the run and applies the same manifest again"),
    "user-rename": KindOfFault(
        "run", (), "the user deletes the run and creates it under another name on the same checkpoint URI"
    ),
    # Edits the controller takes at the next attempt boundary, and a pull: the attempt trains on.
    "user-edit": KindOfFault(
        "run", (SUCCEEDED_,), "the user edits the spec mid-run (checkpoint.keep 2-4, the backoff)", ends_attempt=False
    ),
    "user-pull": KindOfFault(
        "run", (SUCCEEDED_,), "the user pulls the newest checkpoint (spotray pull) mid-run", ends_attempt=False
    ),
    "user-warm-start": KindOfFault(
        "run",
        (SUCCEEDED_,),
        "another run starts from the run's oldest kept checkpoint (checkpoint.startFrom) while it prunes",
        ends_attempt=False,
    ),
}
USER_ACTIONS = tuple(kind for kind in KINDS if kind.startswith("user-"))
RECREATIONS = ("user-recreate", "user-rename")
# How long a suspend may take to show (the run Suspended, its RayJob gone) before the fault is judged missed.
SUSPEND_SEEN_S = 240.0


@dataclass(frozen=True)
class Fault:
    kind: str
    trigger: str  # "step": at a step; "upload": right after a checkpoint save; "start": into an attempt's start-up
    value: float  # the step, the save's step, or the seconds after the attempt's RayJob appeared


@dataclass
class Landing:
    kind: str
    trigger: str
    attempts: list[int]  # the attempts it hit (a cluster fault: the one running, if any)
    step: int  # the newest step the job had reported
    store: str  # what the run's checkpoint prefix held at that moment
    seconds: float  # since the trial began
    detail: str = ""
    missed: bool = False  # nothing to hit (the attempt had ended): it counts for nothing
    reached: int = -1  # the newest step once the fault had acted (a RayJob's deletion takes seconds)
    # Which object of the run it hit: 0 the first; each user-recreate or user-rename makes the next.
    # ``attempts`` are that object's attempt numbers (a run created again counts from 1 again).
    instance: int = 0


def draw_faults(
    rng: random.Random, pace: Pace, lead: str | None = None, kinds: dict[str, KindOfFault] = KINDS
) -> list[Fault]:
    """One or two faults (``lead`` among them) in firing order, the second later in the run than the
    first (``Pace.steps_for``). A run fault acts on a running job, so it fires at a step or after a
    save; a cluster fault also into an attempt's start-up: the first attempt's, or, second, the one
    the first fault's attempt made way for (every run fault ends its attempt; a cluster fault may not)."""
    count = rng.choice([1, 1, 2])
    chosen = [lead] if lead else []
    while len(chosen) < count:
        chosen.append(rng.choice(list(kinds)))
    rng.shuffle(chosen)
    faults: list[Fault] = []
    for order, kind in enumerate(chosen):
        starts_one = order == 0 or (kinds[faults[0].kind].scope == "run" and kinds[faults[0].kind].ends_attempt)
        triggers = ["step", "upload"] + (["start"] if kinds[kind].scope == "cluster" and starts_one else [])
        trigger = rng.choice(triggers)
        if trigger == "step":
            value: float = rng.choice(pace.steps_for(order, count))
        elif trigger == "upload":
            value = rng.choice(pace.saves_for(order, count))
        else:
            value = round(rng.uniform(0, 20), 1)
        faults.append(Fault(kind, trigger, value))
    return faults


# ------------------------------------------------------------------------------- the controller


class Controller:
    """``python -m spotray.controller`` as a process, with a stand-in for the kubelet's liveness probe."""

    def __init__(
        self, kubeconfig: Path, namespace: str, log_path: Path, s3_endpoint: str, checkpoint_keys: bool = False
    ) -> None:
        self.log_path = log_path
        self.health_port, metrics_port = free_ports(2)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "SPOTRAY_NAMESPACES": namespace,
            "SPOTRAY_SUBMISSION_MODE": "HTTPMode",  # kwok pods run no submitter
            "SPOTRAY_RECONCILE_INTERVAL_SECONDS": "1",
            "SPOTRAY_SETTLE_SECONDS": "2",
            "SPOTRAY_METRICS_PORT": str(metrics_port),
            "SPOTRAY_HEALTH_PORT": str(self.health_port),
            "SPOTRAY_ALLOWED_S3_ENDPOINTS": s3_endpoint,
            "SPOTRAY_RUN_CHECKPOINT_KEYS": "true" if checkpoint_keys else "false",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()  # one change of the process at a time (faults, the liveness probe)
        self.liveness_restarts = 0
        self._paused = False
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._liveness, daemon=True)

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            command = [sys.executable, "-m", "spotray.controller"]
            self.proc = tb.popen_dying_with_us(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            tb.wait_until("the controller's /healthz", self.healthy, timeout=90, interval=0.5)
        except TimeoutError:  # kept running: the liveness probe restarts it if it never gets there
            print("[nemesis] the controller is not healthy 90 s after its start", flush=True)
        if not self._prober.is_alive():
            self._prober.start()

    def healthy(self, timeout: float = 2) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=timeout) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self._paused = False

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            self.kill()

    def _liveness(self) -> None:
        failures = 0
        while not self._stop.wait(LIVENESS_PERIOD_S):
            with self.lock:
                if self._paused or self.proc is None or self.proc.poll() is not None:
                    failures = 0  # a fault holds it down on purpose and brings it back itself
                    continue
                failures = 0 if self.healthy(timeout=5) else failures + 1
                if failures >= LIVENESS_FAILURES:
                    print(f"[nemesis] liveness: /healthz failed {failures} times, restarting the controller")
                    self.kill()
                    self.start()
                    self.liveness_restarts += 1
                    failures = 0


# ------------------------------------------------------------------------------- Ray heads


# A head that fails to start (each start already tries `ray start` three times) is replaced by a new
# one, up to this many failures in a row: without it, each failure left one warm head fewer, and
# attempts then waited for a head that never came (trials 13 and 15 of campaign seed 1).
MAX_FAILED_HEAD_STARTS = 5


class RayHeads:
    """Real Ray heads on loopback, one per attempt's RayCluster, ``warm`` of them kept started.

    A head pod is not Ready before its Ray is up, but a kwok pod is Ready at once: a head started
    only when its RayJob appears would make KubeRay's first submissions fail and back off for
    minutes, which no real cluster does. So heads are started ahead, and handed out as RayJobs
    appear. Every head is started from one long-lived thread: a process started by the test bed
    dies with the thread that started it (PR_SET_PDEATHSIG follows the thread).
    """

    def __init__(self, root: Path, pod_env: dict[str, str], warm: int, needed: int | None = None) -> None:
        self.root, self.pod_env, self.warm_target = root, pod_env, warm
        # How many attempts will want one (None: no end in sight): none is started beyond that,
        # but one that died is always replaced. On 2 cores a spare head's start-up slows the rest.
        self.needed = needed
        self.warm: queue.Queue[tb.RayHead] = queue.Queue()  # up, not yet given to an attempt
        self.owned: list[tb.RayHead] = []  # every head not yet stopped, up or starting
        self.lock = threading.Lock()
        self.count = 0
        self.failed_starts = 0  # in a row: a machine too loaded to start one (other work on its 2 cores)
        self.starter = ThreadPoolExecutor(1, thread_name_prefix="nemesis-heads")

    @staticmethod
    def alive(head: tb.RayHead) -> bool:
        return head.proc is not None and head.proc.poll() is None and not tb.ray_head_address_free(head.address)

    def fill(self) -> None:
        """Start ``warm`` heads and wait until they answer."""
        for _ in range(self.warm_target):
            self._start_one()
        tb.wait_until("the warm Ray heads", lambda: self.warm.qsize() >= self.warm_target, timeout=300, interval=1)

    def take(self) -> tb.RayHead:
        """A head that is up (one that died while it waited is stopped and replaced); another starts."""
        while True:
            head = self.warm.get(timeout=300)
            alive = self.alive(head)
            if not alive or self.needed is None or self.count < self.needed:
                self._start_one()  # the next spare, or a replacement for a dead one
            if alive:
                return head
            print(f"[nemesis] a warm Ray head at {head.address} died; taking another", flush=True)
            self.release(head)

    def replace(self, dead: tb.RayHead) -> tb.RayHead:
        """Stop what is left of ``dead`` and start another at its address; returns it once up."""
        self.release(dead)
        head = self._new(dead.address)
        self.starter.submit(head.start).result()
        return head

    def release(self, head: tb.RayHead) -> None:
        with self.lock:
            if head in self.owned:
                self.owned.remove(head)
        with contextlib.suppress(Exception):
            head.stop()

    def stop(self) -> None:
        self.starter.shutdown(wait=True)  # the heads still starting are up (or failed) after this
        with self.lock:
            heads, self.owned = list(self.owned), []
        for head in heads:
            with contextlib.suppress(Exception):
                head.stop()

    def _new(self, address: str = "") -> tb.RayHead:
        with self.lock:
            if not address:
                taken = {head.address for head in self.owned}  # some not listening yet
                address = next(a for a in tb.RAY_HEAD_IPS if a not in taken and tb.ray_head_address_free(a))
            self.count += 1
            head = tb.RayHead(self.root / f"head-{self.count}", address, num_cpus=2, extra_env=self.pod_env)
            self.owned.append(head)
        return head

    def _start_one(self) -> None:
        head = self._new()

        def start() -> None:
            try:
                head.start()
            except Exception as error:  # noqa: BLE001 - started again below, within a bound
                self.release(head)
                with self.lock:
                    self.failed_starts += 1
                    again = self.failed_starts <= MAX_FAILED_HEAD_STARTS
                print(f"[nemesis] a Ray head did not start ({'starting another' if again else 'giving up'}): "
                      f"{error!r}", flush=True)  # fmt: skip
                if again:  # else take() says, within its bound, that no head came
                    self._start_one()
                return
            with self.lock:
                self.failed_starts = 0
            self.warm.put(head)

        self.starter.submit(start)


# ------------------------------------------------------------------------------- the campaign


def read_run(custom: client.CustomObjectsApi, namespace: str, name: str) -> tuple[str, dict[str, Any]] | None:
    """The TrainingRun's UID and status; None when it is not there or the API server did not answer
    within 5 s (asked again next round)."""
    try:
        found = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, _request_timeout=(3, 5))
    except Exception:  # noqa: BLE001 - unknown this round, asked again next round
        return None
    return str(found["metadata"]["uid"]), dict(found.get("status") or {})


def read_run_status(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    """The TrainingRun's status; None when the API server did not answer within 5 s (asked again next round)."""
    found = read_run(custom, namespace, name)
    return found[1] if found else None


def read_rayjobs(custom: client.CustomObjectsApi, namespace: str, run: str) -> list[dict[str, Any]] | None:
    """The run's RayJobs (by its label); None when the API server did not answer within 5 s."""
    try:
        found = custom.list_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayjobs", label_selector=f"{RUN_LABEL}={run}", _request_timeout=(3, 5)
        )
    except Exception:  # noqa: BLE001 - unknown this round, asked again next round
        return None
    return list(found.get("items") or [])


def rayjob_creations(bed: tb.Testbed, user: str, run: str) -> Counter[str]:
    """RayJob name -> how many times ``user``'s create of it succeeded (the API server's audit log)."""
    created: Counter[str] = Counter()
    pattern = re.compile(rf"^{re.escape(run)}-a\d+$")
    for event in bed.requests_by(user):
        ref = event.get("objectRef") or {}
        code = (event.get("responseStatus") or {}).get("code", 0)
        if event.get("verb") == "create" and ref.get("resource") == "rayjobs" and 200 <= code < 300:
            name = str(ref.get("name") or (event.get("responseObject") or {}).get("metadata", {}).get("name", ""))
            if pattern.match(name):
                created[name] += 1
    return created


CONTROL_PLANE_FAULTS = ("apiserver-kill", "apiserver-silent", "kuberay-restart")


def control_plane_fault(bed: tb.Testbed, kind: str, down: float) -> str:
    """One of CONTROL_PLANE_FAULTS on the test bed's own processes, held ``down`` seconds, then
    brought back; returns what was done."""
    if kind == "apiserver-kill":
        bed.restart_apiserver(down)
        return f"down {down:.1f} s"
    if kind == "apiserver-silent":
        bed.pause("kube-apiserver")
        try:
            time.sleep(down)
        finally:
            bed.resume("kube-apiserver")
        return f"silent {down:.1f} s"
    bed.restart("ray-operator", down)  # kuberay-restart
    return f"down {down:.1f} s"


def complete_steps(keys: list[str]) -> set[int]:
    """The steps of the checkpoints whose manifest is in a listing of a run's prefix."""
    steps = set()
    for key in keys:
        folder, _, name = key.partition("/")
        step = parse_checkpoint_step(folder)
        if step is not None and name == MANIFEST_NAME:
            steps.add(step)
    return steps


def pull_found_nothing(exit_code: int, said: str, before: set[int] | None) -> bool:
    """Whether a pull that failed kept its promise anyway: the run had no complete checkpoint when it
    began (``before``, listed just before it) and it said so, as docs/cli.md promises: "no checkpoints"
    with exit 3 (not found), or, with only incomplete ones there (the first being uploaded), "no complete
    checkpoint" with exit 1 (refused). A listing S3 did not answer (None) proves nothing."""
    if before != set():
        return False
    none_at_all = exit_code == EXIT_NOT_FOUND and "no checkpoints" in said
    none_complete = exit_code == EXIT_FAILED and "there is no complete checkpoint" in said
    return none_at_all or none_complete


def commit_window(keys: list[str], saved: list[int]) -> str:
    """Which checkpoints were being written when a fault fired: the commit window.

    A checkpoint is being written from the job's save (``saved``: the steps its ``checkpoint_saved``
    events named since the last fault) until its manifest is in the store. Its files are uploaded
    side by side over one link, so for most of that window the store lists none of them: the
    store's listing alone (files, no manifest) saw the window only in its last moments.
    """
    files: dict[int, set[str]] = {step: set() for step in saved}  # step -> the names listed under it
    for key in keys:
        folder, _, name = key.partition("/")
        step = parse_checkpoint_step(folder)
        if name and step is not None:
            files.setdefault(step, set()).add(name)
    # Checkpoints commit in step order: one older than the newest complete one is pruned (its manifest
    # goes first), not being written. Seen in trial 8: a save at step 10, pruned by step 47, read as pending.
    newest = max(complete_steps(keys), default=-1)
    pending = sorted(step for step, names in files.items() if MANIFEST_NAME not in names and step > newest)
    if pending:
        listed = (f"{checkpoint_dir_name(step)} ({len(files[step])} files, no manifest)" for step in pending)
        return "being written: " + ", ".join(listed)
    return "between checkpoints"


class Campaign:
    """The test bed's parts every trial shares, and the faults acting on them."""

    def __init__(
        self,
        bed: tb.Testbed,
        s3: LocalS3Server,
        namespace: str,
        workdir: Path,
        warm_heads: int = 1,
        heads_needed: int | None = None,
        pace: Pace = CAMPAIGN_PACE,
        checkpoint_key: str | None = None,
    ) -> None:
        self.bed, self.s3, self.namespace, self.workdir, self.pace = bed, s3, namespace, workdir, pace
        # The chart's default, checkpoint keys on: the namespace's key Secret made here, before any run,
        # and the same key in every head's environment (kwok pods run nothing: a job runs on a head,
        # whose environment stands for the pods' secretKeyRef). None: keys off.
        self.checkpoint_key = checkpoint_key
        self.proxy = FaultProxy(s3.port, upload_bytes_per_s=pace.upload_bytes_per_s)
        self.heads: dict[tuple[str, int], tb.RayHead | None] = {}  # (run, attempt) -> its RayCluster's head
        self.heads_lock = threading.Lock()
        pod_env = {**s3.env(), "AWS_ENDPOINT_URL": self.proxy.endpoint_url,
                   "S3_ENDPOINT_URL": self.proxy.endpoint_url, "PYTHONPATH": str(ROOT)}  # fmt: skip
        if checkpoint_key is not None:
            pod_env[CHECKPOINT_KEY_ENV] = checkpoint_key
        self.ray_heads = RayHeads(workdir / "ray", pod_env, warm_heads, heads_needed)
        self.cluster_lock = threading.Lock()  # cluster faults never overlap: each brings its part back
        self.api = config.new_client_from_config(str(bed.kubeconfig))
        self.custom = client.CustomObjectsApi(self.api)
        self.controller: Controller | None = None
        self.user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
        self.direct = s3.config  # the campaign's own reads bypass the proxy
        self.collateral: dict[str, list[Landing]] = {}  # run -> landings of faults other trials fired
        self.reference_batches: dict[int, list[int]] | None = None  # the uninterrupted run's, step -> sample ids

    @contextlib.contextmanager
    def running(self) -> Iterator[Campaign]:
        # Each attempt's cluster goes to its own head, once it has one. A default route (the e2e
        # session's shared head) would take the job of an attempt not yet routed, where no fault
        # finds its driver: in make test the smoke's RayJob deletion then "missed" a running job.
        shared_head = self.bed.default_ray_head()
        self.proxy.start()
        try:
            self.bed.set_default_ray_head(None)  # given back in the finally, whatever fails
            self.s3.create_bucket(BUCKET)  # kept if there (a second campaign on one server)
            self.bed.kubectl("apply", "--server-side", "-f", str(CRD))
            self.bed.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
            self._s3_secret()
            if self.checkpoint_key is not None:
                self.bed.kubectl(
                    "create", "secret", "generic", DEFAULT_CHECKPOINT_KEY_SECRET, "-n", self.namespace,
                    f"--from-literal={CHECKPOINT_KEY_SECRET_DATA_KEY}={self.checkpoint_key}",
                )  # fmt: skip
            kubeconfig = self._controller_kubeconfig()
            self.controller = Controller(
                kubeconfig, self.namespace, self.workdir / "controller.log", self.proxy.endpoint_url,
                checkpoint_keys=self.checkpoint_key is not None,
            )  # fmt: skip
            self.controller.start()
            self.ray_heads.fill()
            yield self
        finally:
            if self.controller is not None:
                self.controller.stop()
            self.ray_heads.stop()
            self.proxy.stop()
            self.bed.kubectl("delete", "clusterrolebinding", f"nemesis-{self.namespace}", check=False)
            self.bed.set_default_ray_head(shared_head)

    def _s3_secret(self) -> None:
        env = {**self.s3.env(), "AWS_ENDPOINT_URL": self.proxy.endpoint_url}
        keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
        literals = [f"--from-literal={key}={env[key]}" for key in keys]
        self.bed.kubectl("create", "secret", "generic", SECRET, "-n", self.namespace, *literals)
        self.bed.kubectl("label", "secret", SECRET, "-n", self.namespace, f"{S3_OPT_IN_LABEL}=true")

    def _controller_kubeconfig(self) -> Path:
        """A ServiceAccount's: the audit log records ServiceAccounts' requests, so every RayJob the
        controller created is on record. Cluster-wide rights: the campaign is not about RBAC."""
        self.bed.kubectl("create", "serviceaccount", ACCOUNT, "-n", self.namespace)
        self.bed.kubectl(
            "create", "clusterrolebinding", f"nemesis-{self.namespace}", "--clusterrole=cluster-admin",
            f"--serviceaccount={self.namespace}:{ACCOUNT}",
        )  # fmt: skip
        path = self.workdir / "controller.kubeconfig"
        return self.bed.service_account_kubeconfig(self.namespace, ACCOUNT, path, duration="24h")

    # -- reading the cluster (every read may fail while a fault holds the API server) -----------

    def run_status(self, name: str) -> dict[str, Any] | None:
        return read_run_status(self.custom, self.namespace, name)

    def run(self, name: str) -> tuple[str, dict[str, Any]] | None:
        return read_run(self.custom, self.namespace, name)

    def rayjobs(self, run: str) -> list[dict[str, Any]] | None:
        return read_rayjobs(self.custom, self.namespace, run)

    def rayjob_creations(self, run: str) -> Counter[str]:
        return rayjob_creations(self.bed, self.user, run)

    def run_uri(self, run: str) -> str:
        return f"s3://{BUCKET}/{self.namespace}/runs/{run}"

    def store(self, run: str) -> S3ObjectStore:
        return S3ObjectStore(parse_uri(self.run_uri(run)), self.direct, RetryPolicy(deadline_s=10))

    def complete_checkpoints(self, uri: str) -> set[int] | None:
        """The steps of the complete checkpoints (manifest there) under ``uri``; None: S3 did not answer."""
        store = S3ObjectStore(parse_uri(uri), self.direct, RetryPolicy(deadline_s=30))
        try:
            keys = [info.key for info in store.list("")]
        except Exception:  # noqa: BLE001 - the rule is then not judged, and the trial says so
            return None
        return complete_steps(keys)

    def store_state(self, run: str, saved: list[int]) -> str:
        """Where the run's checkpointing stood as a fault fired (see ``commit_window``)."""
        try:
            keys = [info.key for info in self.store(run).list("")]
        except Exception as error:  # noqa: BLE001
            return f"unreadable: {type(error).__name__}"
        return commit_window(keys, saved)

    # -- the faults -----------------------------------------------------------------------------

    def cluster_fault(self, kind: str, rng: random.Random) -> str:
        """Act on a shared part; returns what was done. Holds it down, then brings it back."""
        assert self.controller is not None
        down = rng.uniform(*KINDS[kind].held_s)
        with self.cluster_lock:
            if kind == "controller-kill":
                with self.controller.lock:
                    self.controller.kill()
                    time.sleep(down)
                    self.controller.start()
                return f"down {down:.1f} s"
            if kind == "controller-pause":
                with self.controller.lock:
                    self.controller.pause()
                time.sleep(down)
                with self.controller.lock:
                    self.controller.resume()
                return f"stopped {down:.1f} s"
            if kind in CONTROL_PLANE_FAULTS:
                return control_plane_fault(self.bed, kind, down)
            mode = {"s3-refuse": "refuse", "s3-silent": "silent", "s3-500": "error500"}[kind]
            with fault(self.proxy, mode):
                time.sleep(down)
            return f"{mode} {down:.1f} s"

    def attempt_pods(self, run: str, attempt: int) -> list[dict[str, Any]]:
        out = self.bed.kubectl(
            "get", "pods", "-n", self.namespace, "-l", f"{RUN_LABEL}={run},{ATTEMPT_LABEL}={attempt}", "-o", "json",
            check=False,
        )  # fmt: skip
        return list(json.loads(out.stdout)["items"]) if out.returncode == 0 else []

    def job_id(self, run: str, attempt: int) -> str:
        """The Ray job id of the attempt's RayJob; "" when it has none or is gone.

        Read, never guessed from an error: an API server just restarted refuses or does not serve
        the RayJob kind yet for a few seconds, and a fault judged "missed" on that would be wrong.
        """
        deadline = time.monotonic() + 60
        while True:
            out = self.bed.kubectl(
                "get", "rayjob", rayjob_name(run, attempt), "-n", self.namespace, "-o", "jsonpath={.status.jobId}",
                check=False,
            )  # fmt: skip
            if out.returncode == 0:
                return out.stdout.strip()
            if "(NotFound)" in out.stderr:
                return ""
            if time.monotonic() > deadline:
                raise RuntimeError(f"the RayJob {rayjob_name(run, attempt)} unreadable for 60 s: {out.stderr.strip()}")
            time.sleep(1)

    # -- each attempt's Ray cluster: a real Ray head per RayCluster ------------------------------

    def start_head(self, run: str, attempt: int) -> None:
        """Give that attempt's RayCluster a warm Ray head of its own and route the operator to it
        (in the background; the attempt waits for it as a RayCluster waits for its head pod)."""
        with self.heads_lock:
            if (run, attempt) in self.heads:
                return
            self.heads[(run, attempt)] = None

        def assign() -> None:
            try:
                head = self.ray_heads.take()
                with self.heads_lock:
                    self.heads[(run, attempt)] = head
                self._route(run, attempt, head)
            except Exception as error:  # noqa: BLE001 - the attempt then never starts, which the trial reports
                print(f"[nemesis] no Ray head for {rayjob_name(run, attempt)}: {error!r}", flush=True)

        threading.Thread(target=assign, daemon=True).start()

    def _route(self, run: str, attempt: int, head: tb.RayHead) -> None:
        name = rayjob_name(run, attempt)
        self.bed.bridge_ray_job(self.namespace, name, head.address, timeout=120)
        # KubeRay may have tried the head before the bridge knew it, and backed off for up to
        # minutes: any change to the RayJob makes it look again now.
        self.bed.kubectl("annotate", "--overwrite", "rayjob", name, "-n", self.namespace,
                         f"nemesis.spotray.dev/ray-head={head.address}", check=False)  # fmt: skip

    def revive_head(self, run: str, attempt: int) -> bool:
        """A head given to an attempt that died by itself (Ray's start-up timing out on a loaded
        machine; a head pod's container would be restarted): start another at its address.
        Returns whether it had to. Not a fault of the campaign's: the trial notes it."""
        with self.heads_lock:
            head = self.heads.get((run, attempt))
        if head is None or self.ray_heads.alive(head):
            return False
        replacement = self.ray_heads.replace(head)
        with self.heads_lock:
            self.heads[(run, attempt)] = replacement
        self._route(run, attempt, replacement)
        return True

    def copy_ray_logs(self, run: str, attempts: list[int], into: Path) -> None:
        """Copy the Ray logs of each attempt's head (the job's driver, Ray Train's actors, the raylet)
        before the head is stopped and its temp dir deleted: a failed trial keeps them with its own."""
        for attempt in attempts:
            head = self.heads.get((run, attempt))
            if head is None or head.temp_dir is None:
                continue
            logs = head.temp_dir / "session_latest" / "logs"
            for path in sorted(logs.glob("*")) if logs.is_dir() else []:
                if path.is_file() and path.suffix in (".log", ".out", ".err") and path.stat().st_size:
                    target = into / f"attempt-{attempt}" / path.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(OSError):  # one log gone meanwhile is only one fewer to read
                        shutil.copyfile(path, target)

    def stop_heads(self, run: str, attempts: list[int]) -> None:
        for attempt in attempts:
            with self.heads_lock:
                head = self.heads.pop((run, attempt), None)
            if head is not None:
                self.ray_heads.release(head)

    def driver_pids(self, run: str, attempt: int, job_id: str) -> list[int]:
        """The job's entrypoint processes (the driver and what it runs), found by its open driver log."""
        head = self.heads.get((run, attempt))
        if not job_id or head is None or head.temp_dir is None:  # None: not yet given one
            return []
        return head.job_pids(job_id)

    def lose_node(
        self, run: str, attempt: int, controller_down: bool, rng: random.Random
    ) -> tuple[str, list[tuple[str, int, bool]]]:
        """The node of the attempt's worker lost as a cloud loses a spot VM; every attempt with a pod
        on it loses its job's processes. Returns the node and (run, attempt, whether its job was
        running) for each attempt it hit."""
        assert self.controller is not None
        workers = [
            p for p in self.attempt_pods(run, attempt) if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]
        node = next((p["spec"].get("nodeName") for p in workers if p["spec"].get("nodeName")), None)
        if node is None:
            return "", []
        with self.cluster_lock if controller_down else contextlib.nullcontext():
            if controller_down:
                with self.controller.lock:
                    self.controller.kill()
            hit = sorted(set(self.attempts_on(node)) | {(run, attempt)})
            with contextlib.suppress(RuntimeError):  # a pod already gone, or the API server held by a fault
                self.bed.preempt_node(node)
            jobs = {pair: self.job_id(*pair) for pair in hit}
            killed = {pair: self.driver_pids(*pair, job) for pair, job in jobs.items()}
            for pids in killed.values():
                tb.kill_pids(pids)
            if controller_down:
                # What the controller finds when it is back: the RayJobs failed, the pods and node gone.
                for name, number in jobs:
                    with contextlib.suppress(TimeoutError):
                        tb.wait_until(
                            f"RayJob {rayjob_name(name, number)} to fail",
                            lambda n=name, a=number: self._job_ended(n, a),
                            60,
                            1,
                        )
                time.sleep(rng.uniform(0, 5))
                with self.controller.lock:
                    self.controller.start()
            time.sleep(3)
            self.bed.restore_node(node)
        return node, [(name, number, bool(killed[name, number])) for name, number in hit]

    def attempts_on(self, node: str) -> list[tuple[str, int]]:
        """(run, attempt) of every pod of a run on ``node``."""
        out = self.bed.kubectl(
            "get", "pods", "-n", self.namespace, "--field-selector", f"spec.nodeName={node}", "-o", "json", check=False
        )  # fmt: skip
        pods = json.loads(out.stdout)["items"] if out.returncode == 0 else []
        labels = [p["metadata"].get("labels") or {} for p in pods]
        return [
            (pod[RUN_LABEL], int(pod[ATTEMPT_LABEL])) for pod in labels if RUN_LABEL in pod and ATTEMPT_LABEL in pod
        ]

    def _job_ended(self, run: str, attempt: int) -> bool:
        out = self.bed.kubectl(
            "get", "rayjob", rayjob_name(run, attempt), "-n", self.namespace, "-o", "jsonpath={.status.jobStatus}",
            check=False,
        )  # fmt: skip
        return out.returncode != 0 or out.stdout.strip() in ("FAILED", "STOPPED", "SUCCEEDED")


# ------------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class WarmStart:
    """A second run, started from the trial's checkpoint-<step> (``checkpoint.startFrom``) on a URI of its own."""

    name: str
    uri: str
    dir: Path
    step: int


@dataclass
class TrialResult:
    number: int
    seed: int
    faults: list[Fault]
    landings: list[Landing]
    problems: list[str]
    seconds: float
    attempts: list[str] = field(default_factory=list)  # "1 Preempted/NodeLost", ...
    steps_lost: list[int] = field(default_factory=list)
    kept: str = ""  # where a failed (or unexplained: see unexplained_interruptions) trial's logs are
    notes: list[str] = field(default_factory=list)  # what went wrong on the campaign's side (not judged)


class Trial:
    """One TrainingRun, followed every second, its faults fired when due."""

    def __init__(self, campaign: Campaign, number: int, seed: int, faults: list[Fault]) -> None:
        self.campaign, self.number, self.seed = campaign, number, seed
        self.faults = faults  # fired in this order, each once the one before it has landed
        self.name = f"t{number}"  # the run's name now (user-rename gives it another)
        self.names = [self.name]  # every name it had
        self.uri = campaign.run_uri(self.name)  # the run's checkpoint URI, whatever its name
        self.dir = campaign.workdir / self.name
        self.rng = random.Random(seed)
        # The run as an object: a user-recreate or user-rename deletes it and makes another (``instance``
        # counts them), whose history begins again at attempt 1; the earlier objects' histories are kept.
        self.uid, self.instance, self.object_name = "", 0, self.name  # object_name: the name the object has
        self.history: list[tuple[float, dict[str, Any]]] = []
        self.earlier: list[list[tuple[float, dict[str, Any]]]] = []
        self.keeps = [3]  # spec.checkpoint.keep, and each value a user-edit gave it
        self.rayjob_uids: dict[str, set[str]] = {}  # "<RayJob> of run <its run's UID>" -> the RayJob's UIDs seen
        self.appeared: dict[int, float] = {}  # attempt -> when its RayJob was first seen
        # Heads of a deleted run's attempts: (name, attempt, instance), stopped once their RayJob is gone.
        self.leftover_heads: list[tuple[str, int, int]] = []
        self.pull_failures: list[str] = []  # a user-pull that did not end with a verified checkpoint
        self.warm_failures: list[str] = []  # a user-warm-start that did not start from the trial's checkpoint
        self.events = self.dir / "events.jsonl"
        self.cursor = EventCursor(self.events)
        self.step = 0  # the newest step the job reported
        self.saved: list[int] = []  # checkpoint saves since the last landing
        self.job_attempt = 0  # the attempt the job's newest worker group belongs to
        self.landings: list[Landing] = []
        self.in_flight: threading.Thread | None = None
        self.started = 0.0
        self.since = 0.0  # when the last fault fired: a start trigger waits for an attempt begun after it
        self.notes: list[str] = []

    def manifest(self, warm: WarmStart | None = None) -> dict[str, Any]:
        """The trial's TrainingRun; ``warm``: the run that starts from one of its checkpoints."""
        name, uri, into = (warm.name, warm.uri, warm.dir) if warm else (self.name, self.uri, self.dir)
        document = yaml.safe_load((ROOT / "jobs" / "gpt2" / "trainingrun.yaml").read_text())
        document["metadata"] = {"name": name}
        spec, pace = document["spec"], self.campaign.pace
        spec["entrypoint"] = (
            f"SPOTRAY_SAMPLE_LOG={into / 'samples'} python -m spotray.jobs.gpt2 --max-steps {pace.steps} "
            f"--batch-size {BATCH} --n-layer 1 --n-embd 32 --min-step-seconds {pace.step_seconds} "
            f"--workdir {into / 'job'} --events {into / 'events.jsonl'}"
        )
        spec["workers"] = {"replicas": 1, "cpu": "1", "memory": "2Gi", "gpu": 0, "spot": True}
        spec["checkpoint"] = {
            "uri": uri,
            "everySteps": pace.every,
            "keep": self.keeps[0],
            "secretRef": SECRET,
        }
        if warm:
            spec["checkpoint"]["startFrom"] = f"{self.uri}/{checkpoint_dir_name(warm.step)}"
        spec["data"] = {"uri": f"s3://{BUCKET}/datasets/gpt2-nemesis"}
        spec["retry"] = {"maxPreemptions": 10, "maxFailures": 5, "backoffSeconds": 1}
        return document

    def run(self) -> TrialResult:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.campaign.bed.apply(self.manifest(), namespace=self.campaign.namespace)
        pending = list(self.faults)
        problems: list[str] = []
        # The API server is read in a thread of its own: its calls take a second or more under load,
        # and a fault due right after a save must fire within EVENTS_POLL_S, while the upload runs.
        done_observing = threading.Event()
        observer = threading.Thread(target=self._observe_until, args=(done_observing,), name=f"{self.name}-observer")
        observer.start()
        try:
            while True:
                now = time.monotonic() - self.started
                if now > TRIAL_TIMEOUT_S:
                    problems.append(f"not ended after {TRIAL_TIMEOUT_S:.0f} s: {self._last_status().get('message')}")
                    break
                self._read_events()
                idle = self.in_flight is None or not self.in_flight.is_alive()
                if idle and self.in_flight is not None:
                    self.in_flight, self.saved = None, []
                if idle and pending and self._due(pending[0], now):
                    self._fire(pending.pop(0), now)
                # Ended and settled: a run that ended while S3 failed owes its last progress and
                # checkpoint until the store answers (docs/controller.md), and is judged after.
                last = self._last_status()
                ended = last.get("phase") in TERMINAL_PHASES and not last.get("storageUnreachableSince")
                if ended and self.in_flight is None:
                    break
                time.sleep(EVENTS_POLL_S)
        finally:
            done_observing.set()
            observer.join()
        self.campaign.copy_ray_logs(self.name, list(self.appeared), self.dir / "ray-logs")
        self.campaign.stop_heads(self.name, list(self.appeared))
        self._retire_leftover_heads(still_listed=set())
        for missed in pending:  # the run ended before its moment came
            why = f"never due: the job's newest step {self.step}, of attempt {self.job_attempt}"
            self.landings.append(Landing(missed.kind, missed.trigger, [], self.step, "", now, why, True))
        self.landings += self.campaign.collateral.pop(self.name, [])
        problems += judge(self)
        return TrialResult(
            self.number,
            self.seed,
            self.faults,
            self.landings,
            problems,
            round(time.monotonic() - self.started, 1),
            [
                f"{a.get('attempt')} {a.get('outcome')}/{a.get('reason')}"
                for a in self._last_status().get("attempts") or []
            ],
            [r["reached"] - r["resumed"] for r in restarts(self.events)],
            notes=self.notes,
        )

    # -- following the run ------------------------------------------------------------------------

    def _last_status(self) -> dict[str, Any]:
        return self.history[-1][1] if self.history else {}

    def _observe_until(self, done: threading.Event) -> None:
        while not done.is_set():
            self._observe(time.monotonic() - self.started)
            done.wait(POLL_S)

    def _observe(self, now: float) -> None:
        name = self.name  # read once: a user-rename changes it meanwhile
        found = self.campaign.run(name)
        if found is not None:
            uid, status = found
            if uid != self.uid:
                self._new_object(uid, name)
            self.history.append((now, status))
        jobs = self.campaign.rayjobs(name)
        for job in jobs or []:
            meta = job["metadata"]
            owner = next((ref.get("uid", "") for ref in meta.get("ownerReferences") or []), "")
            self.rayjob_uids.setdefault(f"{meta['name']} of run {owner}", set()).add(meta["uid"])
            if owner != self.uid:
                continue  # a deleted run's, going with it
            attempt = int(meta.get("labels", {}).get(ATTEMPT_LABEL, 0))
            # A RayJob name is unique: the deleted run's of this name is gone, and its head with it.
            self._retire_leftover_heads(still_listed=set(), only=(name, attempt))
            if attempt not in self.appeared:
                self.appeared[attempt] = now
                self.campaign.start_head(name, attempt)
        if self.leftover_heads:
            self._retire_leftover_heads(self._rayjobs_listed({leftover[0] for leftover in self.leftover_heads}))
        if jobs is not None and self.appeared:  # a head whose RayJob is gone has nothing left to run
            listed = {int(job["metadata"].get("labels", {}).get(ATTEMPT_LABEL, 0)) for job in jobs}
            gone = [a for a in self.appeared if a not in listed and a < max(self.appeared)]
            self.campaign.stop_heads(self.name, gone)
        newest = max(self.appeared, default=0)
        running = self._last_status().get("phase") not in TERMINAL_PHASES
        if newest and running and self.campaign.revive_head(self.name, newest):
            self.notes.append(f"the Ray head of attempt {newest} died by itself at {now:.0f} s; another was started")

    def _new_object(self, uid: str, name: str) -> None:
        """The run is another object now (deleted and applied again, or under another ``name``): its
        history and attempts begin again; the old object's heads go once their RayJobs are gone."""
        if self.uid:
            self.earlier.append(self.history)
            self.history = []
            self.leftover_heads += [(self.object_name, attempt, self.instance) for attempt in self.appeared]
            self.appeared = {}
            self.instance += 1
        self.uid, self.object_name = uid, name

    def _rayjobs_listed(self, names: set[str]) -> set[tuple[str, int]] | None:
        """(run name, attempt) of every RayJob of these runs; None when the API server did not answer."""
        listed = set()
        for name in names:
            jobs = self.campaign.rayjobs(name)
            if jobs is None:
                return None
            listed |= {(name, int(job["metadata"].get("labels", {}).get(ATTEMPT_LABEL, 0))) for job in jobs}
        return listed

    def _retire_leftover_heads(
        self, still_listed: set[tuple[str, int]] | None, only: tuple[str, int] | None = None
    ) -> None:
        """Stop the heads of a deleted run's attempts whose RayJobs are gone (not in ``still_listed``;
        None: unknown, nothing stopped), their Ray logs copied first; ``only``: that one alone."""
        if still_listed is None:
            return
        for name, attempt, instance in list(self.leftover_heads):
            if (name, attempt) in still_listed or (only is not None and (name, attempt) != only):
                continue
            self.leftover_heads.remove((name, attempt, instance))
            self.campaign.copy_ray_logs(name, [attempt], self.dir / "ray-logs" / f"run-object-{instance}")
            self.campaign.stop_heads(name, [attempt])

    def _read_events(self) -> None:
        for event in self.cursor.new_events():
            if event["event"] == "step":
                self.step = int(event["step"])
            elif event["event"] == "checkpoint_saved":
                self.saved.append(int(event["step"]))
            elif event["event"] == "start":  # a worker group began: from its resume point on
                self.job_attempt = int(event.get("attempt") or 0)
                self.step = int(event.get("resumed_from") or 0)

    def _due(self, fault: Fault, now: float) -> bool:
        if fault.trigger == "step":
            return self.step >= fault.value and self.job_attempt > 0
        if fault.trigger == "upload":
            return any(step >= fault.value for step in self.saved)
        # An attempt begun since the last fault (the observer thread adds to appeared: a copy, read at once).
        fresh = [at for at in list(self.appeared.values()) if at >= self.since]
        return bool(fresh) and now >= min(fresh) + fault.value

    def _fire(self, fault: Fault, now: float) -> None:
        self.since = now
        self.in_flight = deliver(fault, now, self.step, self._inject, self.landings)

    def _inject(self, fault: Fault, now: float) -> Landing:
        campaign, attempt = self.campaign, self.job_attempt
        store = campaign.store_state(self.name, list(self.saved))
        job = campaign.job_id(self.name, attempt) if attempt else ""
        running = bool(campaign.driver_pids(self.name, attempt, job))
        landing = Landing(fault.kind, fault.trigger, [attempt] if running else [], self.step, store, round(now, 1))
        landing.instance = self.instance
        if KINDS[fault.kind].scope == "cluster":
            landing.detail = campaign.cluster_fault(fault.kind, self.rng)
            return landing
        if not running:
            landing.missed, landing.detail = True, f"attempt {attempt}'s job was not running"
            return landing
        if fault.kind in ("node-lost", "node-lost-controller-down"):
            node, hit = campaign.lose_node(self.name, attempt, fault.kind.endswith("controller-down"), self.rng)
            landing.detail = f"node {node}; attempts hit (run, attempt, its job running): {hit}"
            for run, number, running in hit:
                # Another trial's attempt on the same node: hit too, if its job was running. One not
                # yet started gets its pods back from KubeRay and may be judged either way: unjudged.
                if run != self.name:
                    what = f"node {node}, lost by {self.name}"
                    campaign.collateral.setdefault(run, []).append(
                        Landing(fault.kind, "collateral", [number], -1, "", -1, what, missed=not running)
                    )
            landing.missed = not node
        elif fault.kind == "rayjob-deleted":
            campaign.bed.kubectl(
                "delete", "rayjob", rayjob_name(self.name, attempt), "-n", campaign.namespace, "--wait=false",
                check=False,
            )  # fmt: skip
            # Its pods' processes go with it, as KubeRay's finalizer tears its cluster down (kwok pods
            # run nothing): at once, not once the finalizer is done, or the job trains on meanwhile.
            tb.kill_pids(campaign.driver_pids(self.name, attempt, job))
        elif fault.kind == "driver-killed":
            tb.kill_pids(campaign.driver_pids(self.name, attempt, job))
        elif fault.kind == "user-suspend":
            landing.detail = self._suspend_and_resume(attempt, job)
        elif fault.kind in RECREATIONS:
            landing.detail = self._create_again(renamed=fault.kind == "user-rename")
        elif fault.kind == "user-edit":
            landing.detail = self._edit_spec()
        elif fault.kind == "user-pull":
            landing.detail = self._pull()
        elif fault.kind == "user-warm-start":
            landing.detail, started = self._warm_start()
            landing.missed = not started
        else:  # spot-notice: the driver's own SIGTERM (it drains this attempt's Ray cluster)
            drivers = [pid for pid in campaign.driver_pids(self.name, attempt, job) if is_job_driver(pid)]
            for pid in drivers[:1]:
                os.kill(pid, signal.SIGTERM)
            landing.missed = not drivers
        landing.reached = self.step
        return landing

    def _suspend_and_resume(self, attempt: int, job: str) -> str:
        """spec.suspend true; once the run says Suspended and its RayJob is gone, what is left of the job
        killed (kwok pods run nothing: its processes on the Ray head are KubeRay's teardown here, as for
        ``rayjob-deleted``); then spec.suspend false after a drawn pause."""
        campaign, rayjob = self.campaign, rayjob_name(self.name, attempt)

        def stopped() -> bool:
            jobs = {j["metadata"]["name"] for j in campaign.rayjobs(self.name) or []}
            return (campaign.run_status(self.name) or {}).get("phase") == "Suspended" and rayjob not in jobs

        _set_suspend(campaign, self.name, True)
        asked, step = time.monotonic(), self.step
        try:
            tb.wait_until(f"{self.name} Suspended, {rayjob} gone", stopped, timeout=SUSPEND_SEEN_S, interval=0.5)
        finally:
            took = time.monotonic() - asked
            tb.kill_pids(campaign.driver_pids(self.name, attempt, job))
            held = self.rng.uniform(*KINDS["user-suspend"].held_s)
            time.sleep(held)
            _set_suspend(campaign, self.name, False)
        return f"suspended at step {step}: Suspended and {rayjob} gone {took:.1f} s later; resumed {held:.1f} s after"

    def _create_again(self, renamed: bool) -> str:
        """``kubectl delete trainingrun`` (it returns once the run is gone; its RayJobs go after it, by the
        garbage collector and KubeRay's finalizer, which stops their jobs), then at once ``kubectl apply``
        of the same manifest: under the same name, or another (``renamed``) on the same checkpoint URI.
        Returns once the new object is followed and the old one's Ray heads are gone (so the next fault
        finds the new run's job)."""
        campaign, old, instance = self.campaign, self.name, self.instance
        campaign.bed.kubectl("delete", "trainingrun", old, "-n", campaign.namespace)
        deleted = time.monotonic()
        self.name = f"{old}-again" if renamed else old
        if renamed:
            self.names.append(self.name)
        self.job_attempt = 0  # step triggers wait for the new run's job
        campaign.bed.apply(self.manifest(), namespace=campaign.namespace)
        applied = time.monotonic() - deleted

        def old_run_gone() -> bool:
            return self.instance > instance and not any(left[2] == instance for left in self.leftover_heads)

        tb.wait_until(f"the run created again as {self.name}, {old}'s RayJobs gone", old_run_gone, 180, 0.5)
        return (
            f"{old} deleted, {self.name} applied {applied:.1f} s later; {old}'s RayJobs gone after "
            f"{time.monotonic() - deleted:.0f} s"
        )

    def _edit_spec(self) -> str:
        """An edit the controller takes at the next attempt: checkpoint.keep (2-4) and the backoff."""
        keep, backoff = self.rng.choice([2, 3, 4]), self.rng.choice([1, 2])
        self.keeps.append(keep)
        patch = json.dumps({"spec": {"checkpoint": {"keep": keep}, "retry": {"backoffSeconds": backoff}}})
        self.campaign.bed.kubectl("patch", "trainingrun", self.name, "-n", self.campaign.namespace, "--type=merge",
                                  "-p", patch)  # fmt: skip
        return f"checkpoint.keep {keep}, retry.backoffSeconds {backoff}"

    def _pull(self) -> str:
        """``spotray pull <run> DIR`` as a user runs it beside the training (kubectl's credentials, S3's
        from the environment, the key from the namespace's Secret). It must end with a verified checkpoint,
        or, when the run had none complete as the pull began, say so with exit 3
        (not found): what docs/cli.md promises (trial 41 pulled at step 3, before the first checkpoint)."""
        before = self.campaign.complete_checkpoints(self.uri)
        into = self.dir / f"pulled-{len(self.landings)}"
        env = {**os.environ, **self.campaign.s3.env(), "KUBECONFIG": str(self.campaign.bed.kubeconfig)}
        if self.campaign.checkpoint_key is not None:
            env[CHECKPOINT_KEY_ENV] = self.campaign.checkpoint_key
        spotray = str(Path(sys.executable).parent / "spotray")
        command = [spotray, "pull", self.name, str(into), "-n", self.campaign.namespace]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
        said = (done.stdout + done.stderr).strip().replace("\n", " | ")
        if done.returncode != 0 and not pull_found_nothing(done.returncode, said, before):
            self.pull_failures.append(f"spotray pull exited {done.returncode}: {said}")
        return f"exit {done.returncode}: {said[:300]}"

    def _warm_start(self) -> tuple[str, bool]:
        """A run on a URI of its own with ``checkpoint.startFrom`` naming the trial's oldest complete
        checkpoint, the one its ``keep`` prunes next, while the trial trains on (a PBT exploit). It
        must start from that checkpoint or, pruned meanwhile, a newer one of the trial's, never fail
        (bad input) nor touch the trial's checkpoints; followed to its end, then deleted. Returns what
        happened and whether there was a checkpoint to start from (none: missed)."""
        campaign = self.campaign
        complete = campaign.complete_checkpoints(self.uri)
        if not complete:
            return "no complete checkpoint to start from yet", False
        name = f"{self.names[0]}-warm{len(self.landings)}"
        warm = WarmStart(name, campaign.run_uri(name), self.dir / name, min(complete))
        warm.dir.mkdir(parents=True)
        campaign.bed.apply(self.manifest(warm), namespace=campaign.namespace)
        attempts: set[int] = set()
        final: dict[str, Any] = {}
        deadline = time.monotonic() + TRIAL_TIMEOUT_S / 2
        try:
            while time.monotonic() < deadline and final.get("phase") not in TERMINAL_PHASES:
                for job in campaign.rayjobs(name) or []:
                    attempt = int(job["metadata"].get("labels", {}).get(ATTEMPT_LABEL, 0))
                    if attempt not in attempts:
                        attempts.add(attempt)
                        campaign.start_head(name, attempt)
                final = campaign.run_status(name) or final
                time.sleep(POLL_S)
        finally:
            campaign.copy_ray_logs(name, sorted(attempts), warm.dir / "ray-logs")
            campaign.stop_heads(name, sorted(attempts))
            campaign.bed.kubectl("delete", "trainingrun", name, "-n", campaign.namespace, "--wait=false", check=False)
        starts = [e for e in EventCursor(warm.dir / "events.jsonl").new_events() if e["event"] == "start"]
        resumed = int(starts[0].get("resumed_from") or 0) if starts else None
        ended = f"{final.get('phase')} ({final.get('message')})"
        said = f"{name} from checkpoint-{warm.step}: {ended}, resumed from {resumed}"
        if final.get("phase") != "Succeeded":
            self.warm_failures.append(f"the warm start {said}")
        elif resumed is None or resumed < warm.step:
            self.warm_failures.append(f"the warm start {said}: not from checkpoint-{warm.step} or a newer one")
        return said, True


def _set_suspend(campaign: Campaign, run: str, suspend: bool) -> None:
    patch = json.dumps({"spec": {"suspend": suspend}})
    campaign.bed.kubectl("patch", "trainingrun", run, "-n", campaign.namespace, "--type=merge", "-p", patch)


def deliver(
    fault: Fault, now: float, step: int, inject: Callable[[Fault, float], Landing], landings: list[Landing]
) -> threading.Thread:
    """``inject(fault, now)`` in a thread of its own (a fault may hold its part down for a while), its
    landing added to ``landings``; a fault the campaign could not deliver is added missed, with why."""

    def run() -> None:
        try:
            landings.append(inject(fault, now))
        except Exception as error:  # noqa: BLE001 - recorded: a fault the campaign could not deliver
            landings.append(Landing(fault.kind, fault.trigger, [], step, "", now, f"{error!r}", True))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def is_job_driver(pid: int) -> bool:
    """Whether ``pid`` is the job's Python driver itself. Ray's job supervisor runs the entrypoint through
    a shell, whose command line names the job too: a SIGTERM to that shell ended it (exit -15, a
    training failure to the controller) and left the driver training on (trial 13 of seed 1)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return False
    program = Path(argv[0].decode(errors="replace")).name
    return program.startswith("python") and b"spotray.jobs.gpt2" in argv


# ------------------------------------------------------------------------------- the checker


def judge(trial: Trial) -> list[str]:
    """Every promise the run broke, as sentences; empty when it kept them all."""
    final = trial._last_status()
    made = sum((trial.campaign.rayjob_creations(name) for name in trial.names), Counter())
    creations = once_per_object(made, trial.rayjob_uids)
    # Faults that hit an earlier object of the run judge nothing of this one's attempts.
    landings = [land for land in trial.landings if land.instance == trial.instance or KINDS[land.kind].scope != "run"]
    problems = promises_broken(final, trial.history, trial.rayjob_uids, creations, landings, trial.campaign.pace)
    for earlier in trial.earlier:
        problems += [f"(a deleted object of the run) {problem}" for problem in judged_once(earlier)]
    problems += trial.pull_failures + trial.warm_failures
    reported = checkpoints_reported(trial)
    present = trial.campaign.complete_checkpoints(trial.uri)
    if present is not None:
        problems += checkpoints_vanished(reported, present, min(trial.keeps))
    else:
        trial.notes.append("S3 did not list the checkpoints at the end: whether any vanished was not judged")
    if final.get("phase") != "Succeeded":
        return problems
    for restart in restarts(trial.events):
        if restart["resumed"] < restart["complete"]:
            problems.append(f"resumed from {restart['resumed']}, but checkpoint-{restart['complete']} was complete")
        if restart["emergency"] is not None and restart["resumed"] != restart["emergency"]:
            problems.append(f"resumed from {restart['resumed']}, not the emergency checkpoint {restart['emergency']}")
    reference = trial.campaign.reference_batches
    if reference is not None and trained_batches(trial.dir / "samples") != reference:
        problems.append("the batches trained differ from the uninterrupted run's")
    return problems


def promises_broken(
    final: dict[str, Any],
    history: list[tuple[float, dict[str, Any]]],
    rayjob_uids: dict[str, set[str]],
    creations: Counter[str],
    landings: list[Landing],
    pace: Pace,
    kinds: dict[str, KindOfFault] = KINDS,
) -> list[str]:
    """The promises judged from the run's status (``final``, and its ``history`` as polled), the
    RayJobs seen (name -> UIDs), the controller's RayJob creations (the audit log) and the faults'
    landings: every test bed's checker starts here; a run that did not succeed breaks the first."""
    if final.get("phase") != "Succeeded":
        return [f"phase {final.get('phase')}: {final.get('message')}"]
    problems = []
    progress, last = final.get("progress") or {}, final.get("lastCheckpoint") or {}
    if (progress.get("step"), progress.get("totalSteps"), last.get("step")) != (pace.steps,) * 3:
        problems.append(
            f"progress {progress.get('step')}/{progress.get('totalSteps')}, last checkpoint {last.get('step')}"
        )
    attempts = final.get("attempts") or []
    numbers = [int(a["attempt"]) for a in attempts]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"attempt numbers {numbers}: one was skipped or used twice")
    problems += judged_once(history)
    for name, uids in rayjob_uids.items():
        if len(uids) > 1:
            problems.append(f"RayJob {name} existed as {len(uids)} different objects: created again")
    for name, count in creations.items():
        if count > 1:
            problems.append(f"RayJob {name} created {count} times (audit log)")
    problems += outcomes_allowed(attempts, landings, pace, kinds)
    spent = (int(final.get("preemptions", 0)), int(final.get("failures", 0)))
    counted = (
        sum(a.get("outcome") == "Preempted" for a in attempts),
        sum(a.get("outcome") == "Failed" for a in attempts),
    )
    if spent != counted:
        problems.append(f"budgets spent (preemptions, failures) {spent}, the attempts' outcomes count {counted}")
    return problems


def once_per_object(creations: Counter[str], rayjob_uids: dict[str, set[str]]) -> Counter[str]:
    """The audit log's creations of each RayJob name, less one for each further run object that had a
    RayJob of that name (a run deleted and applied again makes its attempts' RayJobs again)."""
    objects = Counter(key.split(" of run ")[0] for key in rayjob_uids)
    return Counter({name: count - max(0, objects[name] - 1) for name, count in creations.items()})


def checkpoints_reported(trial: Trial) -> set[int]:
    """Every checkpoint said complete: in the run's status (any object of it) or by the job's events."""
    reported = {
        int(step)
        for history in [*trial.earlier, trial.history]
        for _, status in history
        if (step := (status.get("lastCheckpoint") or {}).get("step")) is not None
    }
    for event in EventCursor(trial.events).new_events():
        if event["event"] in ("checkpoint_complete", "emergency_checkpoint"):
            reported.add(int(event["step"]))
    return reported


def checkpoints_vanished(reported: set[int], present: set[int], keep: int) -> list[str]:
    """Issue #69's rule: a checkpoint ever reported complete is still in the store, or was pruned by the
    run's own ``keep`` for newer ones (at least ``keep`` newer complete ones are there)."""
    problems = []
    for step in sorted(reported - present):
        newer = sorted(s for s in present if s > step)
        if len(newer) < keep:
            gone = f"checkpoint-{step} was reported complete and is gone"
            problems.append(f"{gone}, with only {newer} newer in the store (keep {keep})")
    return problems


def judged_once(history: list[tuple[float, dict[str, Any]]]) -> list[str]:
    """An attempt's outcome, once given, never changes; the budgets spent never go down."""
    problems: list[str] = []
    outcomes: dict[int, tuple[Any, Any]] = {}
    spent = (0, 0)
    for at, status in history:
        now = (int(status.get("preemptions", 0)), int(status.get("failures", 0)))
        if now[0] < spent[0] or now[1] < spent[1]:
            problems.append(f"at {at:.0f} s the budgets spent went from {spent} to {now}")
        spent = now
        for attempt in status.get("attempts") or []:
            pair = (attempt.get("outcome"), attempt.get("reason"))
            if pair[0] in (None, "Running"):
                continue
            first = outcomes.setdefault(int(attempt["attempt"]), pair)
            if first != pair:
                problems.append(f"attempt {attempt['attempt']} judged {first}, then {pair} at {at:.0f} s")
                outcomes[int(attempt["attempt"])] = pair
    return problems


def late_from(kind: KindOfFault, pace: Pace) -> int:
    """From this step on a run fault may find the job already finished: at the last step, or for a
    notice within the last interval, where the steps left can take less time than the drain."""
    return pace.steps - pace.every if kind.notice else pace.steps


def outcomes_allowed(
    attempts: list[dict[str, Any]], landings: list[Landing], pace: Pace, kinds: dict[str, KindOfFault] = KINDS
) -> list[str]:
    """Each attempt's outcome is one that what hit it allows: a run fault's own, or (no run fault)
    finished, or interrupted by an infrastructure fault, which spends nothing. On kwok a run fault
    ends its attempt; on real pods a worker lost without notice may be replaced inside it, and a later
    run fault then ends it: any of the run faults that hit an attempt may say how it ended."""
    cluster_faults = any(kinds[land.kind].scope == "cluster" and not land.missed for land in landings)
    by_attempt: dict[int, list[Landing]] = {}
    before_start = {n for land in landings if land.trigger == "collateral" and land.missed for n in land.attempts}
    for land in landings:
        if kinds[land.kind].scope == "run" and not land.missed:
            for number in land.attempts:
                by_attempt.setdefault(number, []).append(land)
    problems = []
    for attempt in attempts:
        number, pair = int(attempt["attempt"]), (attempt.get("outcome"), attempt.get("reason"))
        hits = by_attempt.get(number, [])
        allowed = {INTERRUPTED} if cluster_faults else set()
        # The job may have finished before the fault took effect (or, on real pods, despite it).
        if not hits or any(max(hit.step, hit.reached) >= late_from(kinds[hit.kind], pace) for hit in hits):
            allowed.add(SUCCEEDED_)
        for hit in hits:
            allowed |= set(kinds[hit.kind].judged)
        if number in before_start:  # its pods lost before its job ran: either judgement is fair
            allowed |= {SUCCEEDED_, *KINDS["node-lost"].judged}
        if pair not in allowed:
            what = ", ".join(f"{hit.kind} at step {hit.step}" for hit in hits) or "no run fault"
            judged = f"attempt {number} judged {pair[0]}/{pair[1]} ({attempt.get('message')})"
            problems.append(f"{judged}; {what} allows {sorted(allowed)}")
    return problems


# ------------------------------------------------------------------------------- the campaign's run


def keep_logs(campaign: Campaign, trial: Trial, result: TrialResult) -> str:
    """What a failed trial leaves for a person: its status history, landings, the controller's log."""
    record = {"result": asdict(result), "history": [{"t": t, "status": s} for t, s in trial.history]}
    (trial.dir / "trial.json").write_text(json.dumps(record, indent=2, default=str))
    if campaign.controller is not None:
        shutil.copy(campaign.controller.log_path, trial.dir / "controller.log")
    return str(trial.dir)


def unexplained_interruptions(attempts: list[str], landings: list[Landing]) -> list[int]:
    """Attempts that ended Interrupted (nothing spent, so the checker passes them: any cluster fault of
    the trial allows it) although no fault landed in them or in the attempt before (an outage that
    began there may reach into the next one's start), nor between attempts. Something else stopped
    them, the test bed or the product, and a person should read why: such a trial keeps its logs as a
    failed one does (trial 96 had one and left nothing to read)."""
    landed = [land for land in landings if not land.missed]
    if any(not land.attempts for land in landed):
        return []  # a fault between attempts (or before the first) may explain any of them
    if any(land.kind in RECREATIONS for land in landed):
        return []  # the run created again numbers its attempts from 1 again: the landings name the old ones
    near = {number + later for land in landed for number in land.attempts for later in (0, 1)}
    interrupted = [int(text.split()[0]) for text in attempts if text.split()[1].startswith("Interrupted/")]
    return [number for number in interrupted if number not in near]


def note_unexplained(result: TrialResult) -> bool:
    """Note on ``result`` the attempts ``unexplained_interruptions`` finds; True if there were any
    (the trial then keeps its logs). Both campaigns' ``run_trial`` ask it."""
    unexplained = unexplained_interruptions(result.attempts, result.landings)
    if unexplained:
        result.notes.append(f"attempts {unexplained} ended Interrupted with no fault of the trial in them")
    return bool(unexplained)


def run_trial(campaign: Campaign, number: int, seed: int, faults: list[Fault]) -> TrialResult:
    trial = Trial(campaign, number, seed, faults)
    result = trial.run()
    if note_unexplained(result) or result.problems:
        result.kept = keep_logs(campaign, trial, result)
    if number == 0 and not result.problems:  # the reference, even one that keeps its logs
        campaign.reference_batches = trained_batches(trial.dir / "samples")
    campaign.bed.kubectl("delete", "trainingrun", trial.name, "-n", campaign.namespace, "--wait=false", check=False)
    if not result.kept:
        shutil.rmtree(trial.dir, ignore_errors=True)
    return result


def print_result(result: TrialResult) -> None:
    verdict = "ok  " if not result.problems else "FAIL"
    landed = "; ".join(
        f"{land.kind}@{land.trigger}{f' (missed: {land.detail})' if land.missed else ''}: step {land.step}, "
        f"attempts {land.attempts}, {land.store or '-'}"
        for land in result.landings
    )
    head = f"[nemesis] {verdict} trial {result.number} (seed {result.seed}, {result.seconds:.0f} s)"
    print(f"{head} attempts {result.attempts}: {landed}", flush=True)
    for problem in result.problems:
        print(f"           - {problem}", flush=True)
    for note in result.notes:
        print(f"           (note: {note})", flush=True)
    if result.kept:
        print(f"           logs: {result.kept}", flush=True)


def campaign_trials(
    campaign: Campaign,
    numbers: Sequence[int],
    seed: int,
    parallel: int,
    kinds: list[str] | None = None,
    log: TrialLog | None = None,
) -> list[TrialResult]:
    """The reference run, then the trials ``numbers``, ``parallel`` at a time; each one's faults
    depend on (seed, number) only, so a campaign split over several runs draws the same trials."""
    reference = run_trial(campaign, 0, seed, [])
    print_result(reference)
    if reference.problems:
        raise SystemExit("the uninterrupted reference run failed: nothing to compare the trials with")

    def one(number: int) -> TrialResult:
        rng = random.Random(seed * 100_003 + number)
        lead = (kinds or list(KINDS))[(number - 1) % len(kinds or KINDS)]
        faults = draw_faults(rng, campaign.pace, lead)
        result = run_trial(campaign, number, seed * 100_003 + number, faults)
        print_result(result)
        if log is not None:
            log.append(result)
        return result

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        futures = [pool.submit(one, number) for number in numbers]
        return [future.result() for future in futures]
    except KeyboardInterrupt:
        # Each trial's processes die with its thread only once the trial has cleaned up: a trial cut
        # short left its job's driver and Ray workers running. So the trials in flight finish.
        print("[nemesis] stopping: the trials in flight finish (each within its bound), no new one starts", flush=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class TrialLog:
    """Every judged trial, one JSON line each, appended as it ends: a campaign longer than one sitting
    (200 trials take hours) is run in parts (``--first``), and a part cut short keeps what it judged.
    Each line names the commit it ran, so the summary says which code the trials tested."""

    STAMP = ("commit", "campaign_seed", "parallel")  # on every line, beside the trial's result

    def __init__(self, path: Path, campaign_seed: int, parallel: int) -> None:
        self.path, self.lock = path, threading.Lock()
        self.stamp = dict(zip(self.STAMP, (current_commit(), campaign_seed, parallel), strict=True))

    def append(self, result: TrialResult) -> None:
        line = json.dumps(asdict(result) | self.stamp, sort_keys=True)
        with self.lock, self.path.open("a") as out:
            out.write(line + "\n")

    @staticmethod
    def read(path: Path) -> tuple[list[TrialResult], list[dict[str, Any]]]:
        """The results, and each line's stamp (commit, campaign seed, parallel)."""
        results, stamps = [], []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            stamps.append({key: record.pop(key) for key in TrialLog.STAMP})
            record["faults"] = [Fault(**f) for f in record["faults"]]
            record["landings"] = [Landing(**land) for land in record["landings"]]
            results.append(TrialResult(**record))
        return results, stamps


def latest_runs(
    results: list[TrialResult], stamps: list[dict[str, Any]]
) -> tuple[list[TrialResult], list[dict[str, Any]]]:
    """Each trial's latest run (a trial is its campaign seed and number: the same faults at the same
    moments), and every earlier run of one, listed with its verdict and commit, never dropped. A trial
    is run again only after a fault of the campaign itself was fixed (docs/nemesis.md says which)."""
    latest: dict[tuple[int, int], int] = {}
    for index, (result, stamp) in enumerate(zip(results, stamps, strict=True)):
        latest[(stamp["campaign_seed"], result.number)] = index
    kept = sorted(latest.values())
    earlier = [
        {"number": r.number, "commit": stamp["commit"], "problems": r.problems, "kept": r.kept}
        for index, (r, stamp) in enumerate(zip(results, stamps, strict=True))
        if index not in set(kept)
    ]
    return [results[index] for index in kept], earlier


def summary(results: list[TrialResult], kinds: dict[str, KindOfFault] = KINDS) -> dict[str, Any]:
    landed = [land for r in results for land in r.landings if land.trigger != "collateral"]
    by_kind: dict[str, dict[str, int]] = {}
    for kind in kinds:
        mine = [r for r in results if any(land.kind == kind for land in r.landings)]
        by_kind[kind] = {
            "trials": len(mine),
            "landed": sum(1 for land in landed if land.kind == kind and not land.missed),
            "missed": sum(1 for land in landed if land.kind == kind and land.missed),
            "trials_passed": sum(1 for r in mine if not r.problems),
        }
    windows = Counter(
        "checkpoint being written" if land.store.startswith("being written") else
        "attempt start-up" if land.trigger == "start" else "between checkpoints"
        for land in landed if not land.missed
    )  # fmt: skip
    lost = [n for r in results for n in r.steps_lost]
    return {
        "trials": len(results),
        "passes": sum(1 for r in results if not r.problems),
        "fault_kinds": by_kind,
        "windows": dict(windows),
        "steps_lost_per_restart": {
            "count": len(lost), "max": max(lost, default=0), "mean": round(sum(lost) / max(1, len(lost)), 2),
        },
        "seconds_per_trial": round(sum(r.seconds for r in results) / max(1, len(results)), 1),
        "campaign_notes": [f"trial {r.number}: {note}" for r in results for note in r.notes],
        "failures": [
            {"trial": r.number, "seed": r.seed, "faults": [asdict(f) for f in r.faults], "problems": r.problems,
             "logs": r.kept}
            for r in results if r.problems
        ],
    }  # fmt: skip


def stop_like_ctrl_c(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument(
        "--first", type=int, default=1, help="number of the first trial (to run a campaign in parts; see --log)"
    )
    parser.add_argument(
        "--user-actions",
        action="store_true",
        help=f"the user-actions campaign (issue #69): trials led by {', '.join(USER_ACTIONS)}, checkpoint keys "
        "on (the chart's default); its own log and bench/results/nemesis-user-actions.json",
    )
    parser.add_argument(
        "--log",
        type=Path,
        default=None,
        help="append each judged trial here (default: bench/results/<campaign>-trials.jsonl); "
        "bench/results/<campaign>.json summarizes every trial in it",
    )
    parser.add_argument(
        "--summarize", action="store_true", help="run nothing: rewrite the campaign's result from the trials in --log"
    )
    parser.add_argument(
        "--parallel", type=int, default=1, help="trials at once (they share the cluster and its faults)"
    )
    parser.add_argument(
        "--again",
        type=lambda text: [int(number) for number in text.split(",") if number],
        default=[],
        metavar="N,N",
        help="trials to run again before the range, after a fix (each keeps its earlier runs in the log)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default="", help="comma-separated fault kinds to lead trials (default: all)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where trials and kept logs go (default: a new temp dir)"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/nemesis.json")
    args = parser.parse_args()
    name = "nemesis-user-actions" if args.user_actions else "nemesis"
    args.log = args.log or RESULTS_DIR / f"{name}-trials.jsonl"
    kinds = [k for k in args.kinds.split(",") if k] or (list(USER_ACTIONS) if args.user_actions else None)
    for kind in kinds or []:
        if kind not in KINDS:
            parser.error(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    if args.summarize and args.no_write:
        parser.error("--summarize writes nemesis.json: it cannot go with --no-write")
    log = None if args.no_write else args.log
    signal.signal(signal.SIGTERM, stop_like_ctrl_c)  # a part is stopped cleanly, whichever signal ends it
    if not args.summarize:
        ran = run_campaign(args, kinds, log)
        if log is None:
            return 0 if all(not r.problems for r in ran) else 1
    if log is None or not log.exists():
        parser.error(f"no trials to summarize: {log} does not exist (run some first, or name another --log)")
    where = "kwok test bed: real kube-apiserver, etcd, KubeRay, the controller, a Ray head per attempt, SeaweedFS"
    if args.user_actions:
        where += "; checkpoint keys on (one namespace key)"
    return write_summary(name, log, KINDS, CAMPAIGN_PACE, where, module="nemesis")


def write_summary(
    name: str, log: Path, kinds: dict[str, KindOfFault], pace: Pace, where: str, module: str | None = None
) -> int:
    """bench/results/<name>.json from every trial in ``log`` (each by its latest run); the exit code:
    0 when every trial kept every promise. ``module``: the campaign's in bench/ (default: ``name``)."""
    every_run, stamps = TrialLog.read(log)
    results, earlier = latest_runs(every_run, stamps)
    details = summary(results, kinds) | {
        # Every run, not only each trial's latest: a trial run again after a fix counts its failed run here.
        "runs": {"run": len(every_run), "passed": sum(1 for run in every_run if not run.problems)},
        "earlier_runs": earlier,
        "log": str(log.relative_to(ROOT)) if log.is_relative_to(ROOT) else str(log),
        "commits": dict(Counter(stamp["commit"] for stamp in stamps)),
        "campaign_seeds": sorted({stamp["campaign_seed"] for stamp in stamps}),
        "parallel": sorted({stamp["parallel"] for stamp in stamps}),
        "pace": asdict(pace),
        "where": where,
        "machine": machine_details(),
    }
    ratio = details["passes"] / max(1, details["trials"])
    print(json.dumps({k: details[k] for k in ("trials", "passes", "windows", "fault_kinds", "commits")}, indent=2))
    command = " ".join([f"python -m bench.campaigns.{module or name}", *sys.argv[1:]])
    path = write_result(name, ratio, ">= 1.0", "every trial keeps every promise", command, details)
    print(f"[{name}] wrote {path} ({details['trials']} trials in {log})")
    return 0 if ratio == 1.0 else 1


def run_campaign(args: argparse.Namespace, kinds: list[str] | None, log: Path | None) -> list[TrialResult]:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotray-nemesis-"))
    print(f"[nemesis] work directory (failed trials keep their logs here): {workdir}", flush=True)
    started = time.monotonic()
    trial_log = TrialLog(log, args.seed, args.parallel) if log is not None else None
    numbers = [*args.again, *range(args.first, args.first + args.trials)]
    with tb.Testbed(workdir / "testbed") as bed, LocalS3Server(workdir / "seaweedfs") as s3:
        bed.kubectl("create", "namespace", "nemesis")
        key = secrets.token_hex(32) if args.user_actions else None
        campaign_parts = Campaign(bed, s3, "nemesis", workdir, warm_heads=args.parallel + 1, checkpoint_key=key)
        with campaign_parts.running() as campaign:
            results = campaign_trials(campaign, numbers, args.seed, args.parallel, kinds, trial_log)
            liveness = campaign.controller.liveness_restarts if campaign.controller else 0
    passed = sum(1 for r in results if not r.problems)
    minutes = (time.monotonic() - started) / 60
    print(f"[nemesis] trials {numbers}: {passed}/{len(results)} passed in {minutes:.1f} min, "
          f"{liveness} liveness restarts of the controller", flush=True)  # fmt: skip
    return results


if __name__ == "__main__":
    sys.exit(main())
