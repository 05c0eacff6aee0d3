"""Nemesis on real pods (issue #37, item 5): full trainings of the GPT-2 job in real containers, each
hit by one or two faults at random moments, then judged by bench/campaigns/nemesis.py's history checker where
it applies.

Where it runs: testbed/cluster_demo.py's cluster (docs/testbed.md, "Real pods"): real kubelets,
containerd and runc (an on-demand node for the Ray head, the controller and MinIO; a spot node for
the Ray worker), the chart installed with helm (the controller Deployment and MinIO as real pods),
the KubeRay operator on the host. The campaign reaches the run as a user would: through the API
server and MinIO's S3 port; the job's driver through `kubectl exec` into its head container.

Faults (``KINDS_ON_REAL_PODS``), fired at a drawn step, once the status shows a drawn checkpoint, or
a drawn number of seconds into an attempt's start-up:
- the worker's spot node reclaimed as a cloud does it (``spot-reclaim``: a taint, its pods evicted
  with their grace period so the preStop drain takes the emergency checkpoint in the container, then
  the VM gone), or lost without notice (``node-lost``: the VM gone, then the pods marked
  DisruptionTarget and deleted with the Node), or lost while the controller is down (its Deployment
  scaled to 0 and its pod killed first, scaled back once the RayJob ended or 30 s passed); a new
  spot VM joins ``SPOT_BACK_AFTER_S`` later. A worker lost without notice may be replaced inside
  the attempt (Ray Train's restart of its worker group), which then finishes: that is allowed,
  and its restart is judged as every worker group start is (below);
- the controller's pod killed (its Deployment starts another); MinIO's pod killed (its
  StatefulSet starts it again on the same volume);
- the API server SIGKILLed and started again, or SIGSTOPped; the KubeRay operator SIGKILLed and
  started again (bench/campaigns/nemesis.py's);
- the attempt's RayJob deleted; the job's driver SIGKILLed; the driver's SIGTERM (a spot notice).

The checker asserts for each trial: the run Succeeded with every step and its last checkpoint at the
last step; attempts numbered 1..n, each RayJob created once (the audit log) and seen as one object,
an outcome never changed once given, budgets never going down; each outcome one its fault allows
and the budgets spent equal to the outcomes; every worker group (an attempt's, or Ray Train's restart
inside one) resumed from a checkpoint no older than the newest complete one the store listed before
it started (the jobs' progress records say where and when each started; the campaign lists the store
every 2 s), and an attempt after a notice from the notice's emergency checkpoint. Not checked here
(the kwok campaign checks it): the batch trained at every step (the job's sample log stays in its
container). A trial that fails keeps its status history, landings, the controller's log and the
pods' logs.

Result: bench/results/nemesis_real_pods.json (ratio: trials that kept every promise / trials; goal 1.0).

    .venv/bin/python -m bench.campaigns.nemesis_real_pods --trials 20        # make nemesis-real-pods
    .venv/bin/python -m bench.campaigns.nemesis_real_pods --trials 1 --kinds spot-reclaim
    .venv/bin/python -m bench.campaigns.nemesis_real_pods --ray-cluster-per-run --trials 6   # one Ray cluster per run

With ``--ray-cluster-per-run`` the chart's controller.rayClusterPerRun is on: each run keeps one Ray
cluster across its attempts, and its trials go to a log and result of their own
(nemesis-real-pods-kept-trials.jsonl, nemesis_real_pods_kept.json). The driver's SIGTERM there is a
stopped job, not a notice (``KINDS_ON_A_KEPT_CLUSTER``).

With ``--spares`` each run keeps a spare worker pod (``spareReplicas: 1``) on a second spot node; the
reclaim then takes the node of the pod that runs the Ray Train worker, and the attempt may go on and
finish on the spare (``kinds_judged``). Its trials go to nemesis-real-pods-spares-trials.jsonl and
nemesis_real_pods_spares.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.campaigns import nemesis
from bench.campaigns.nemesis import KINDS, Fault, KindOfFault, Landing, Pace, TrialLog, TrialResult
from bench.common import RESULTS_DIR, ROOT
from spotray.contract.names import ATTEMPT_LABEL, RUN_LABEL, TERMINAL_PHASES, rayjob_name
from spotray.contract.uris import parse_uri
from spotray.train.records.progress_log import MAX_PROGRESS_BYTES, AttemptProgress
from spotray.train.storage.store import RetryPolicy, S3ObjectStore, StoreConfig
from testbed import cluster_demo

tb = cluster_demo.tb
NAMESPACE = cluster_demo.NAMESPACE
SYSTEM = cluster_demo.SYSTEM_NAMESPACE
CONTROLLER = "app.kubernetes.io/component=controller"
MINIO = "app.kubernetes.io/component=minio"
TRIAL_TIMEOUT_S = 1500.0
# A node lost while the controller is down: it stays down until the RayJob ended, or this long.
CONTROLLER_DOWN_S = 30.0
POLL_S = 2.0  # the controller refreshes a run's status every 2 s (the chart's reconcileIntervalSeconds here)
# Full trainings of the demo's model, paced like a real one: a notice's drain has steps left to stop.
REAL_PODS_PACE = Pace(steps=120, every=20, step_seconds=0.5)

DEFAULT_LOG = RESULTS_DIR / "nemesis-real-pods-trials.jsonl"
# With controller.rayClusterPerRun on (--ray-cluster-per-run): a campaign of its own, apart from the default's.
KEPT_LOG = RESULTS_DIR / "nemesis-real-pods-kept-trials.jsonl"
KEPT_RESULT = "nemesis_real_pods_kept"
# With a spare worker pod (--spares): a second spot node, and the trials' own log and result.
SPARES_LOG = RESULTS_DIR / "nemesis-real-pods-spares-trials.jsonl"
SPARES_RESULT = "nemesis_real_pods_spares"
# Both (--ray-cluster-per-run --spares): a spare worker pod on a Ray cluster kept across attempts.
KEPT_SPARES_LOG = RESULTS_DIR / "nemesis-real-pods-kept-spares-trials.jsonl"
KEPT_SPARES_RESULT = "nemesis_real_pods_kept_spares"

# A worker's node lost without notice, the head on its on-demand node untouched: Ray Train replaces the
# worker when a new one joins and goes on inside the attempt from the newest complete checkpoint
# (train/launch/launcher.py, max_failures=-1), so the attempt may finish; or the job ends and the
# attempt is Preempted (NodeLost). On kwok the fault takes the job's processes, so only the latter.
WORKER_LOST = (*KINDS["node-lost"].judged, nemesis.SUCCEEDED_)

KINDS_ON_REAL_PODS: dict[str, KindOfFault] = {
    "spot-reclaim": KindOfFault(
        "run",
        (("Preempted", "SpotNotice"), ("Preempted", "NodeLost")),
        "the worker's spot node reclaimed: its pods evicted with their grace period, then the VM gone",
        notice=True,
    ),
    "node-lost": KindOfFault("run", WORKER_LOST, "the worker's spot node gone without notice"),
    "node-lost-controller-down": KindOfFault(
        "run", WORKER_LOST, "the worker's spot node gone while the controller's Deployment is at 0"
    ),
    "controller-kill": KindOfFault("cluster", (), "the controller's pod killed (its Deployment starts another)"),
    "apiserver-kill": KINDS["apiserver-kill"],
    "apiserver-silent": KINDS["apiserver-silent"],
    "kuberay-restart": KINDS["kuberay-restart"],
    "s3-restart": KindOfFault("cluster", (), "MinIO's pod killed (its StatefulSet starts it again)"),
    "rayjob-deleted": KINDS["rayjob-deleted"],
    "driver-killed": KINDS["driver-killed"],
    "spot-notice": KINDS["spot-notice"],
}

# With controller.rayClusterPerRun on, the driver's SIGTERM is a job stopped, not a notice: its cluster
# outlives the attempt, so it drains no node (train/launch/launcher.py install_driver_sigterm) and the
# driver ends as SIGTERM ends a process, with no record, judged as a killed driver is. The notice that
# takes a node reaches its pod's preStop hook (spot-reclaim).
KINDS_ON_A_KEPT_CLUSTER: dict[str, KindOfFault] = {
    **KINDS_ON_REAL_PODS,
    "spot-notice": KindOfFault(
        "run", KINDS["driver-killed"].judged, "the driver's SIGTERM (a stopped job: no node drained)"
    ),
}


def kinds_judged(ray_cluster_per_run: bool, spares: bool = False) -> dict[str, KindOfFault]:
    """The fault kinds, as judged with controller.rayClusterPerRun on or off, with spares or without.

    With a spare worker pod Ready, a reclaim's notice lets the attempt go on: its group restarts on
    the spare from the emergency checkpoint, and the attempt may finish; without room (the spare not
    joined yet, or itself leaving) the notice ends it as without spares."""
    kinds = dict(KINDS_ON_A_KEPT_CLUSTER if ray_cluster_per_run else KINDS_ON_REAL_PODS)
    if spares:
        reclaim = kinds["spot-reclaim"]
        kinds["spot-reclaim"] = dataclasses.replace(reclaim, judged=(*reclaim.judged, nemesis.SUCCEEDED_))
    return kinds


# Run in the head's container: signal the job's processes, found by the word in their argv (the job's
# module). The driver alone is `python -m <module>` (its argv holds the module as one word); "all"
# adds the shell Ray's job supervisor runs it through. Prints the pids signalled.
JOB_MODULE = "spotray.jobs.gpt2"
SIGNAL_JOB = """
import os, sys
sig, every, word = int(sys.argv[1]), sys.argv[2] == "all", sys.argv[3].encode()
hit = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():  # its own argv holds the word too
        continue
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    driver = os.path.basename(argv[0]).startswith(b"python") and word in argv
    if driver or (every and any(word in part for part in argv)):
        hit.append(int(pid))
hit = hit if every else hit[:1]
for pid in hit:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
print(" ".join(map(str, hit)))
"""


def emergency_step(message: str) -> int | None:
    """The step of the emergency checkpoint a notice's attempt recorded ("... at step N"), if any."""
    found = re.search(r"emergency checkpoint at step (\d+)$", message or "")
    return int(found.group(1)) if found else None


def is_progress_key(key: str) -> bool:
    """Whether ``key`` is an attempt's progress record (spotray.contract.attempts.AttemptId.progress_key)."""
    return re.search(r"(^|/)attempt-\d+\.progress\.json$", key) is not None


def newest_complete(keys: list[str]) -> int:
    """The newest checkpoint whose manifest is in the listing (0: none)."""
    return max(nemesis.complete_steps(keys), default=0)


class RealPodsCampaign:
    """The cluster every trial shares, and the faults acting on it."""

    def __init__(
        self, cluster: cluster_demo.DemoCluster, workdir: Path, ray_cluster_per_run: bool = False, spares: int = 0
    ) -> None:
        self.cluster, self.bed, self.workdir = cluster, cluster.testbed, workdir
        self.ray_cluster_per_run, self.spares = ray_cluster_per_run, spares
        self.kinds = kinds_judged(ray_cluster_per_run, spares > 0)
        if ray_cluster_per_run:  # before the controller's pod is read: the upgrade rolls it out anew
            cluster_demo.set_ray_cluster_per_run(self.bed, on=True)
        self.pace = REAL_PODS_PACE
        self.cluster_lock = threading.Lock()  # faults on shared parts never overlap
        api = config.new_client_from_config(str(self.bed.kubeconfig))
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        (pod,) = self.pods(SYSTEM, CONTROLLER)
        # The audit log names requests by user: the controller's ServiceAccount, as its pod has it.
        self.user = f"system:serviceaccount:{SYSTEM}:{pod['spec']['serviceAccountName']}"
        self.stores: dict[tuple[str, str], S3ObjectStore] = {}  # (run, MinIO's pod address) -> its store

    # -- reading (every read may fail while a fault holds the API server or MinIO) --------------

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return cluster_demo.pods(self.bed, namespace, selector)

    def run_status(self, name: str) -> dict[str, Any] | None:
        return nemesis.read_run_status(self.custom, NAMESPACE, name)

    def rayjobs(self, run: str) -> list[dict[str, Any]] | None:
        return nemesis.read_rayjobs(self.custom, NAMESPACE, run)

    def store(self, run: str) -> S3ObjectStore | None:
        """The run's checkpoint prefix in MinIO, by MinIO's pod address now (a restarted MinIO pod may
        have another); None while that cannot be read."""
        try:
            (minio,) = self.core.list_namespaced_pod(SYSTEM, label_selector=MINIO, _request_timeout=(3, 5)).items
        except Exception:  # noqa: BLE001 - the API server held by a fault, or MinIO between pods
            return None
        address = minio.status.pod_ip if minio.status else None
        if not address:
            return None
        if (run, address) not in self.stores:  # one S3 client per address, not one per poll
            self.stores[(run, address)] = self.new_store(run, address)
        return self.stores[(run, address)]

    def new_store(self, run: str, address: str) -> S3ObjectStore:
        env = self.cluster.s3_env
        store_config = StoreConfig(
            endpoint_url=f"http://{address}:9000",
            region=env["AWS_REGION"],
            access_key_id=env["AWS_ACCESS_KEY_ID"],
            secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            # Bounded against a MinIO that accepts and does not answer: one try, 5 s.
            connect_timeout_s=3,
            read_timeout_s=5,
            request_attempts=1,
        )
        uri = parse_uri(f"s3://{cluster_demo.BUCKET}/runs/{run}")
        return S3ObjectStore(uri, store_config, RetryPolicy(deadline_s=5))

    def store_keys(self, run: str) -> list[str] | None:
        """Every key under the run's checkpoint prefix; None while it cannot be read."""
        store = self.store(run)
        try:
            return [info.key for info in store.list("")] if store is not None else None
        except Exception:  # noqa: BLE001 - MinIO restarting
            return None

    def worker_group_starts(self, run: str) -> list[tuple[int, int, float]]:
        """(attempt, step resumed from, when) of every worker group the run's jobs started, each
        attempt's first and each restart inside one, from the attempts' progress records."""
        store = self.store(run)
        if store is None:
            raise RuntimeError(f"MinIO unreadable: the progress records of {run} cannot be read")
        starts = []
        for info in store.list(""):
            if is_progress_key(info.key):
                progress = AttemptProgress.from_json(store.get_bytes(info.key, max_bytes=MAX_PROGRESS_BYTES))
                if progress.started is not None:
                    starts.append((progress.attempt, progress.resumed_from or 0, progress.started))
                starts += [(progress.attempt, step, at) for step, at in progress.restarts]
        return sorted(starts, key=lambda start: start[2])

    def ray_pods(self, run: str, attempt: int, node_type: str) -> list[dict[str, Any]]:
        """The Ray pods (``node_type``: head or worker) the attempt runs on: labelled with the attempt,
        or with a cluster kept across attempts (controller.rayClusterPerRun), that cluster's, which
        the run's status names for the attempt."""
        owner = f"{ATTEMPT_LABEL}={attempt}"
        if self.ray_cluster_per_run:
            attempts = (self.run_status(run) or {}).get("attempts") or []
            cluster = next((a.get("rayCluster") for a in attempts if a.get("attempt") == attempt), None)
            if not cluster:
                return []
            owner = f"ray.io/cluster={cluster}"
        return self.pods(NAMESPACE, f"{RUN_LABEL}={run},{owner},ray.io/node-type={node_type}")

    def worker_node(self, run: str, attempt: int) -> str:
        """The node of the attempt's worker pod; with spares, of the one that runs the Ray Train worker
        where its pods say so (else the first's: a fault may hold the API server)."""
        pods = self.ray_pods(run, attempt, "worker")
        training = cluster_demo.training_worker_node(self.bed, pods) if self.spares and len(pods) > 1 else None
        return training or next((p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")), "")

    def head_pod(self, run: str, attempt: int) -> str:
        running = [p for p in self.ray_pods(run, attempt, "head") if p["status"].get("phase") == "Running"]
        return str(running[0]["metadata"]["name"]) if running else ""

    # -- the faults -----------------------------------------------------------------------------

    def signal_job(self, run: str, attempt: int, sig: signal.Signals, every: bool) -> list[int]:
        """Send ``sig`` to the attempt's driver (``every``: with the shell that runs it), in its
        head container; returns the pids signalled (none: no job running there)."""
        head = self.head_pod(run, attempt)
        if not head:
            return []
        args = [str(int(sig)), "all" if every else "driver", JOB_MODULE]
        done = self.bed.kubectl(
            "exec", "-n", NAMESPACE, head, "--", "python", "-c", SIGNAL_JOB, *args, check=False
        )  # fmt: skip
        return [int(pid) for pid in done.stdout.split()] if done.returncode == 0 else []

    def cluster_fault(self, kind: str, rng: random.Random) -> str:
        """Act on a shared part; returns what was done. Holds it down, then brings it back."""
        with self.cluster_lock:
            if kind in ("controller-kill", "s3-restart"):
                self.kill_pods(SYSTEM, CONTROLLER if kind == "controller-kill" else MINIO)
                return "pod killed"
            return nemesis.control_plane_fault(self.bed, kind, rng.uniform(*self.kinds[kind].held_s))

    def kill_pods(self, namespace: str, selector: str) -> None:
        """Delete the pods with a grace period of 1 s: their processes SIGTERMed, SIGKILLed a second
        later. Not forced: the object stays until the kubelet confirms, so the controller that
        replaces it (Deployment, StatefulSet) never runs a second one beside it on the same data."""
        self.bed.kubectl("delete", "pod", "-n", namespace, "-l", selector, "--grace-period=1", "--wait=false")

    def lose_node(self, run: str, attempt: int, kind: str) -> str:
        """The attempt's worker node reclaimed or lost (``kind``); a new spot VM joins after
        SPOT_BACK_AFTER_S. Returns the node, "" when the attempt had no worker on one."""
        node = self.worker_node(run, attempt)
        if not node:
            return ""
        controller_down = kind == "node-lost-controller-down"
        with self.cluster_lock, contextlib.ExitStack() as back:
            if controller_down:
                back.callback(self.scale_controller, 1)  # whatever fails below: the next trials need it
                self.scale_controller(0)
            back.callback(self.spot_node_back, node)
            if kind == "spot-reclaim":
                self.bed.reclaim_real_node(node)
            else:
                self.bed.lose_real_node(node)
            if controller_down:
                # What the controller finds when it is back: the pods and node gone, and the RayJob
                # ended, or (Ray Train waiting for a worker to replace the lost one) still running.
                with contextlib.suppress(TimeoutError):
                    ended = f"RayJob {rayjob_name(run, attempt)} to end"
                    tb.wait_until(ended, lambda: self.job_ended(run, attempt), CONTROLLER_DOWN_S)
        return node

    def spot_node_back(self, name: str) -> None:
        """A new spot VM of the same name joins SPOT_BACK_AFTER_S after the old one went."""
        time.sleep(cluster_demo.SPOT_BACK_AFTER_S)
        self.bed.start_real_node(next(n for n in self.bed.real_nodes if n.name == name))
        self.bed.wait_real_nodes_ready([name])

    def scale_controller(self, replicas: int) -> None:
        deployment = "deployment/spotray-controller"
        self.bed.kubectl("scale", deployment, "-n", SYSTEM, f"--replicas={replicas}")
        if replicas == 0:  # gone at once, as a killed process is, not after its graceful stop
            self.kill_pods(SYSTEM, CONTROLLER)
            tb.wait_until("the controller's pod gone", lambda: not self.pods(SYSTEM, CONTROLLER), 120)
        else:
            self.bed.kubectl("rollout", "status", deployment, "-n", SYSTEM, "--timeout=180s")

    def job_ended(self, run: str, attempt: int) -> bool:
        out = self.bed.kubectl(
            "get", "rayjob", rayjob_name(run, attempt), "-n", NAMESPACE, "-o", "jsonpath={.status.jobStatus}",
            check=False,
        )  # fmt: skip
        return out.returncode != 0 or out.stdout.strip() in ("FAILED", "STOPPED", "SUCCEEDED")

    def keep_logs(self, into: Path) -> None:
        """The controller's log and the pods' logs of the namespace, for a person to read."""
        into.mkdir(parents=True, exist_ok=True)
        logs = self.bed.kubectl("logs", "-n", SYSTEM, "deployment/spotray-controller", "--tail=-1", check=False)
        (into / "controller.log").write_text(logs.stdout + logs.stderr)
        (into / "diagnose.txt").write_text(cluster_demo.diagnose(self.bed, log_lines=200))


class RealPodsTrial:
    """One TrainingRun on the real pods, followed every POLL_S, its faults fired when due."""

    def __init__(self, campaign: RealPodsCampaign, number: int, seed: int, faults: list[Fault]) -> None:
        self.campaign, self.number, self.seed, self.faults = campaign, number, seed, faults
        self.name = f"r{number}"
        self.dir = campaign.workdir / self.name
        self.rng = random.Random(seed)
        self.history: list[tuple[float, dict[str, Any]]] = []
        self.rayjob_uids: dict[str, set[str]] = {}
        self.appeared: dict[int, float] = {}  # attempt -> when its RayJob was first seen
        self.complete: list[tuple[float, int]] = []  # (unix time, the newest complete checkpoint listed then)
        self.keys: list[str] = []
        self.landings: list[Landing] = []
        self.in_flight: threading.Thread | None = None
        self.started = self.since = 0.0

    def manifest(self) -> dict[str, Any]:
        pace = self.campaign.pace
        document = cluster_demo.demo_training_run(
            f"{cluster_demo.POD_JOB_DIR}/{self.name}", name=self.name, steps=pace.steps, every=pace.every,
            min_step_seconds=pace.step_seconds, spares=self.campaign.spares,
        )  # fmt: skip
        document["spec"]["retry"] = {"maxPreemptions": 10, "maxFailures": 5, "backoffSeconds": 1}
        return document

    def run(self) -> TrialResult:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.campaign.bed.apply(self.manifest())
        pending, problems = list(self.faults), []
        while True:
            now = time.monotonic() - self.started
            if now > TRIAL_TIMEOUT_S:
                problems.append(f"not ended after {TRIAL_TIMEOUT_S:.0f} s: {self.last_status().get('message')}")
                break
            self.observe(now)
            idle = self.in_flight is None or not self.in_flight.is_alive()
            if idle:
                self.in_flight = None
            if idle and pending and self.due(pending[0], now):
                self.fire(pending.pop(0), now)
            last = self.last_status()
            ended = last.get("phase") in TERMINAL_PHASES and not last.get("storageUnreachableSince")
            if ended and self.in_flight is None:
                break
            time.sleep(POLL_S)
        for missed in pending:
            why = f"never due: the run's newest step {self.step()}"
            self.landings.append(Landing(missed.kind, missed.trigger, [], self.step(), "", now, why, True))
        problems += judge(self)
        attempts = self.last_status().get("attempts") or []
        return TrialResult(
            self.number, self.seed, self.faults, self.landings, problems, round(time.monotonic() - self.started, 1),
            [f"{a.get('attempt')} {a.get('outcome')}/{a.get('reason')}" for a in attempts],
            list((self.last_status().get("goodput") or {}).get("stepsRedone") or []),
        )  # fmt: skip

    # -- following the run ------------------------------------------------------------------------

    def last_status(self) -> dict[str, Any]:
        return self.history[-1][1] if self.history else {}

    def step(self) -> int:
        return int((self.last_status().get("progress") or {}).get("step") or 0)

    def running_attempt(self) -> int:
        """The attempt the status says is running (0: none)."""
        attempts = self.last_status().get("attempts") or []
        return int(attempts[-1]["attempt"]) if attempts and attempts[-1].get("outcome") == "Running" else 0

    def observe(self, now: float) -> None:
        if (keys := self.campaign.store_keys(self.name)) is not None:
            self.keys = keys
            self.complete.append((time.time(), newest_complete(keys)))
        for job in self.campaign.rayjobs(self.name) or []:
            meta = job["metadata"]
            self.rayjob_uids.setdefault(meta["name"], set()).add(meta["uid"])
            attempt = int(meta.get("labels", {}).get(ATTEMPT_LABEL, 0))
            if attempt not in self.appeared:
                self.appeared[attempt] = now
        status = self.campaign.run_status(self.name)
        if status is not None:
            self.history.append((now, status))

    def due(self, fault: Fault, now: float) -> bool:
        trained = bool(self.running_attempt()) and self.step() > 0
        if fault.trigger == "step":
            return trained and self.step() >= fault.value
        if fault.trigger == "upload":  # the status shows the save once its manifest is in the store
            return trained and int((self.last_status().get("lastCheckpoint") or {}).get("step") or 0) >= fault.value
        fresh = [at for at in self.appeared.values() if at >= self.since]
        return bool(fresh) and now >= min(fresh) + fault.value

    def fire(self, fault: Fault, now: float) -> None:
        self.since = now
        self.in_flight = nemesis.deliver(fault, now, self.step(), self.inject, self.landings)

    def inject(self, fault: Fault, now: float) -> Landing:
        campaign, attempt = self.campaign, self.running_attempt()
        store = nemesis.commit_window(list(self.keys), [])
        landing = Landing(fault.kind, fault.trigger, [attempt] if attempt else [], self.step(), store, round(now, 1))
        if campaign.kinds[fault.kind].scope == "cluster":
            landing.detail = campaign.cluster_fault(fault.kind, self.rng)
            return landing
        if not attempt:
            landing.missed, landing.detail = True, "no attempt running"
            return landing
        if fault.kind in ("spot-reclaim", "node-lost", "node-lost-controller-down"):
            node = campaign.lose_node(self.name, attempt, fault.kind)
            landing.missed, landing.detail = not node, f"node {node or '(none: no worker placed)'}"
        elif fault.kind == "rayjob-deleted":
            campaign.bed.kubectl(
                "delete", "rayjob", rayjob_name(self.name, attempt), "-n", NAMESPACE, "--wait=false", check=False
            )  # fmt: skip
        else:  # driver-killed: SIGKILL the job; spot-notice: the driver's own SIGTERM
            killed = fault.kind == "driver-killed"
            sig = signal.SIGKILL if killed else signal.SIGTERM
            hit = campaign.signal_job(self.name, attempt, sig, every=killed)
            landing.missed, landing.detail = not hit, f"{sig.name} to pids {hit} in the head container"
        landing.reached = self.step()
        return landing


def judge(trial: RealPodsTrial) -> list[str]:
    """Every promise the run broke, as sentences; empty when it kept them all."""
    final, campaign = trial.last_status(), trial.campaign
    creations = nemesis.rayjob_creations(campaign.bed, campaign.user, trial.name)
    problems = nemesis.promises_broken(
        final, trial.history, trial.rayjob_uids, creations, trial.landings, campaign.pace, campaign.kinds
    )
    if final.get("phase") != "Succeeded":
        return problems
    try:
        starts = campaign.worker_group_starts(trial.name)
    except Exception as error:  # noqa: BLE001 - unjudged is a problem too
        return [*problems, f"the progress records unreadable: {error!r}"]
    attempts = final.get("attempts") or []
    finished = int(attempts[-1]["attempt"]) if attempts else 0
    if finished not in {attempt for attempt, _, _ in starts}:  # so the resume check below is never vacuous
        problems.append(f"no worker group start of attempt {finished} in the progress records ({len(starts)} found)")
    return problems + resumes_judged(starts, trial.complete) + emergency_resumes(attempts)


# A worker group decides where it resumes as it starts, before its training loop begins (``started``):
# a checkpoint listed complete this long before that was there to take.
RESUME_DECIDED_S = 5.0


def resumes_judged(starts: list[tuple[int, int, float]], complete: list[tuple[float, int]]) -> list[str]:
    """Every worker group (an attempt's, or a restart's inside one) resumed from a checkpoint no
    older than the newest complete one the store listed before it started."""
    problems = []
    for attempt, resumed, started in starts:
        listed = [newest for at, newest in complete if at <= started - RESUME_DECIDED_S]
        newest = max(listed, default=0)
        if resumed < newest:
            problems.append(
                f"a worker group of attempt {attempt} resumed from {resumed}, but checkpoint-{newest} was complete"
            )
    return problems


def emergency_resumes(attempts: list[dict[str, Any]]) -> list[str]:
    """After a notice, the next attempt resumed from the emergency checkpoint the notice's attempt recorded."""
    problems = []
    for before, attempt in itertools.pairwise(attempts):
        emergency = emergency_step(str(before.get("message") or "")) if before.get("reason") == "SpotNotice" else None
        if emergency is not None and "resumedFrom" in attempt and int(attempt["resumedFrom"]) != emergency:
            problems.append(
                f"attempt {attempt['attempt']} resumed from {attempt['resumedFrom']}, not the emergency "
                f"checkpoint {emergency}"
            )
    return problems


def run_trial(campaign: RealPodsCampaign, number: int, seed: int, faults: list[Fault]) -> TrialResult:
    trial = RealPodsTrial(campaign, number, seed, faults)
    result = trial.run()
    if nemesis.note_unexplained(result) or result.problems:
        record = {"result": asdict(result), "history": [{"t": t, "status": s} for t, s in trial.history]}
        (trial.dir / "trial.json").write_text(json.dumps(record, indent=2, default=str))
        campaign.keep_logs(trial.dir)
        result.kept = str(trial.dir)
    else:
        shutil.rmtree(trial.dir, ignore_errors=True)
    cluster_demo.delete_run(campaign.bed, trial.name)  # the next trial's pods need the nodes' room
    return result


STOP = threading.Event()


def stop_after_this_trial(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    print(f"[nemesis-real-pods] {name}: the trial in flight finishes, no new one starts", flush=True)
    STOP.set()


def campaign_trials(
    campaign: RealPodsCampaign, numbers: range, seed: int, kinds: list[str] | None, log: TrialLog | None
) -> list[TrialResult]:
    """The trials ``numbers``, one at a time (two nodes hold one run); each one's faults depend on
    (seed, number) only, so a campaign split over several runs draws the same trials."""
    chosen = kinds or list(campaign.kinds)
    results = []
    for number in numbers:
        if STOP.is_set():
            print(f"[nemesis-real-pods] stopped before trial {number}, as asked", flush=True)
            break
        rng = random.Random(seed * 100_003 + number)
        lead = chosen[(number - 1) % len(chosen)]
        faults = nemesis.draw_faults(rng, campaign.pace, lead, campaign.kinds)
        result = run_trial(campaign, number, seed * 100_003 + number, faults)
        nemesis.print_result(result)
        if log is not None:
            log.append(result)
        results.append(result)
    return results


def campaign_name(ray_cluster_per_run: bool, spares: bool) -> tuple[str, Path]:
    """The result's name and the trial log of a campaign with these settings: each combination has its own."""
    if ray_cluster_per_run and spares:
        return KEPT_SPARES_RESULT, KEPT_SPARES_LOG
    if spares:
        return SPARES_RESULT, SPARES_LOG
    if ray_cluster_per_run:
        return KEPT_RESULT, KEPT_LOG
    return "nemesis_real_pods", DEFAULT_LOG


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--first", type=int, default=1, help="number of the first trial (a campaign run in parts)")
    parser.add_argument(
        "--log",
        type=Path,
        default=DEFAULT_LOG,
        help="append each judged trial here; bench/results/nemesis_real_pods.json summarizes every trial in it",
    )
    parser.add_argument("--summarize", action="store_true", help="run nothing: rewrite the result from --log")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default="", help="comma-separated fault kinds to lead trials (default: all)")
    parser.add_argument("--workdir", type=Path, default=None, help="the cluster's and kept logs' directory")
    parser.add_argument("--no-write", action="store_true", help="write no result and no trial log")
    parser.add_argument(
        "--ray-cluster-per-run",
        action="store_true",
        help="the chart's controller.rayClusterPerRun on: each run keeps one Ray cluster across its attempts "
        f"(its own log and result: {KEPT_LOG.name}, {KEPT_RESULT}.json)",
    )
    parser.add_argument(
        "--spares",
        action="store_true",
        help="each run keeps a spare worker pod (spareReplicas 1) on a second spot node "
        f"(its own log and result: {SPARES_LOG.name}, {SPARES_RESULT}.json; with --ray-cluster-per-run "
        f"{KEPT_SPARES_LOG.name}, {KEPT_SPARES_RESULT}.json)",
    )
    args = parser.parse_args()
    name, default_log = campaign_name(args.ray_cluster_per_run, args.spares)
    if args.log == DEFAULT_LOG:
        args.log = default_log
    kinds = [k for k in args.kinds.split(",") if k] or None
    for kind in kinds or []:
        if kind not in KINDS_ON_REAL_PODS:
            parser.error(f"unknown fault kind {kind!r}; known: {', '.join(KINDS_ON_REAL_PODS)}")
    log = None if args.no_write else args.log
    # SIGINT or SIGTERM: the trial in flight finishes and is logged, no new one starts (a trial cut
    # short would leave its run's pods and a fault's part held down).
    signal.signal(signal.SIGTERM, stop_after_this_trial)
    signal.signal(signal.SIGINT, stop_after_this_trial)
    if not args.summarize:
        ran = run_campaign(args, kinds, log)
        if log is None:
            return 0 if all(not r.problems for r in ran) else 1
    if log is None or not log.exists():
        parser.error(f"no trials to summarize: {log} does not exist (run some first, or name another --log)")
    where = "real pods: real kubelets, containerd and runc; the chart's controller and MinIO as pods; KubeRay"
    if args.ray_cluster_per_run:
        where += "; controller.rayClusterPerRun on (one Ray cluster per run, kept across its attempts)"
    if args.spares:
        where += "; spareReplicas 1 (a spare worker pod on a second spot node)"
    judged = kinds_judged(args.ray_cluster_per_run, args.spares)
    return nemesis.write_summary(name, log, judged, REAL_PODS_PACE, where, module="nemesis_real_pods")


def run_campaign(args: argparse.Namespace, kinds: list[str] | None, log: Path | None) -> list[TrialResult]:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spotray-nemesis-real-"))
    print(f"[nemesis-real-pods] work directory (failed trials keep their logs here): {workdir}", flush=True)
    if subprocess.run([str(ROOT / "testbed" / "images.sh"), "--check"], check=False).returncode != 0:
        raise SystemExit("the test bed's images are missing or older than the sources: run `make testbed`")
    started = time.monotonic()
    trial_log = TrialLog(log, args.seed, 1) if log is not None else None
    numbers = range(args.first, args.first + args.trials)
    spares = 1 if args.spares else 0
    with cluster_demo.demo_cluster(workdir / "cluster", spot_nodes=1 + spares) as cluster:
        campaign = RealPodsCampaign(cluster, workdir, args.ray_cluster_per_run, spares)
        results = campaign_trials(campaign, numbers, args.seed, kinds, trial_log)
    passed = sum(1 for r in results if not r.problems)
    minutes = (time.monotonic() - started) / 60
    ran = f"{results[0].number}-{results[-1].number}" if results else "none"
    print(f"[nemesis-real-pods] trials {ran}: {passed}/{len(results)} passed in {minutes:.1f} min", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
