"""``spotray run FILE --local``: a TrainingRun on this machine, attempts and all, with no cluster.

It plays the parts the cluster plays: an embedded S3 server (SeaweedFS) when no endpoint is
configured, a Ray cluster on loopback, and the controller's attempt loop (a preemption starts the
next attempt, counted against ``spec.retry.maxPreemptions``; a failure against ``maxFailures``).
Faults can be injected at a chosen step so a user sees recovery for themselves:

- ``--kill-worker-at N``: SIGKILL one Ray Train worker process; Ray Train replaces it and training
  continues from the latest complete checkpoint, inside the same attempt;
- ``--kill-all-at N``: SIGKILL the driver and the whole Ray cluster (the head is lost); a new
  cluster and a new attempt start and resume;
- ``--preempt-at N``: SIGTERM the driver, as a spot notice would: the workers take an emergency
  checkpoint, the attempt ends with exit code 143, and the next attempt resumes from it;
- ``--lose-worker-at N`` and ``--add-worker-at M``: a second Ray node, holding one worker, vanishes
  and comes back (spotray/local/node_faults.py): an elastic run goes on smaller, a fixed-size one waits.

How an attempt ended and what comes next is decided by the controller's own functions
(spotray/decisions/attempt_end.py ``classify_end`` and ``end_attempt``), from the same records in the store
and, for an attempt that left none, the driver's exit code and the last lines of its log, as a
RayJob's message gives them: the budgets mean the same here as on a cluster, and so do the words.
Only the backoff differs: local mode starts the next attempt at once after a preemption or a
failure, since there is no capacity to wait for; after an infrastructure fault (the driver's exit
code 75: a store that did not answer), which spends no budget, it waits the controller's backoff,
as a store that is down is not back at once. The next attempt runs on the Ray cluster the last one
left standing and usable (after a failed driver or an infrastructure fault). A lost head needs a
new one, and so does a spot notice: the driver's SIGTERM drains every node of the cluster for
preemption (train/launch/launcher.py), and Ray never takes a drained node back.
``spec.secretEnv`` has no Secrets to read here: each variable comes from this process's variable of
the same name, checked before anything starts and given to the driver and the Ray cluster (its
values never printed, nor in ``SPOTRAY_RUN``, which holds the references only). The run's state
(its id, attempts and budgets spent, in the status' own shape) is kept in
``<workdir>/run-state.json``, so the same command run again goes on from where the run stopped, and
a finished run is not trained again.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotray.contract.attempts import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    OUTCOME_INTERRUPTED,
    OUTCOME_RUNNING,
    OUTCOME_SUSPENDED,
    AttemptId,
    check_run_id,
    new_run_id,
)
from spotray.contract.errors import SpotrayError
from spotray.contract.names import DEPLOYMENT_COMPLETE, FAILED, JOB_FAILED, JOB_SUCCEEDED, SUCCEEDED, TERMINAL_PHASES
from spotray.contract.spec import RunContext, TrainingRun, WorkerSpec, split_secret_ref
from spotray.contract.uris import parse_uri
from spotray.decisions.attempt_end import (
    LOG_TAIL_CHARS,
    AttemptEnd,
    classify_end,
    end_attempt,
    record_end,
    start_attempt,
)
from spotray.decisions.observation import RayJobView
from spotray.decisions.run_state import Plan, RunState
from spotray.decisions.vocabulary import REASON_BAD_INPUT, REASON_INTERRUPTED
from spotray.local.local_ray import LocalRayCluster, LocalRayWorkerNode
from spotray.local.node_faults import NodeLayout, NodeSchedule
from spotray.local.progress import ProgressView, RunTally
from spotray.local.reaper import Reaper
from spotray.train.checkpoints.checkpoint import download_checkpoint, latest_complete_checkpoint
from spotray.train.launch.launcher import DEFAULT_GRACE_SECONDS, RESIZE_CHECK_ENV
from spotray.train.processes.subprocesses import die_with_parent
from spotray.train.records.attempt_records import read_attempt_records
from spotray.train.records.event_log import EVENTS_ENV, EventLog, read_events
from spotray.train.records.goodput import ledger, split_lifetimes
from spotray.train.records.plot import plot_loss_across_attempts
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import StoreConfig, open_store

# How often an elastic run looks for room to grow in a run with node faults (seconds).
LOCAL_RESIZE_CHECK_S = 5
# How long a driver may run on after its Ray head exited before it is stopped (seconds). A head
# drained by a spot notice exits once its workers are done, a moment before the driver does; a
# driver whose head died under it waits for the gone GCS, which Ray bounds by no deadline of ours.
HEAD_LOST_GRACE_S = 10.0
# Spare worker nodes take the loopback addresses after the lost node's (127.0.0.3): 127.0.0.4, .5, ...
SPARE_HOST_FIRST = 4


@dataclass(frozen=True)
class Faults:
    kill_worker_at: int | None = None
    kill_all_at: int | None = None
    preempt_at: int | None = None
    nodes: NodeSchedule = field(default_factory=lambda: NodeSchedule([]))


@dataclass
class EventCursor:
    """Reads the events appended to a JSON-lines file since the last call (complete lines only)."""

    path: Path
    offset: int = 0

    def new_events(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(complete)
        events = []
        for line in complete.splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut off by a kill
        return events


def s3_uris(run: TrainingRun) -> list[str]:
    uris = [run.spec.checkpoint.uri, run.spec.data.uri or ""]
    return [uri for uri in uris if uri.startswith("s3://")]


def needs_embedded_s3(run: TrainingRun, environ: dict[str, str]) -> bool:
    """True when the run uses S3 and no endpoint or credentials are configured: local mode brings its own."""
    configured = any(environ.get(name) for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT_URL"))
    return bool(s3_uris(run)) and not configured


def secret_env_from(run: TrainingRun, environ: Mapping[str, str]) -> dict[str, str]:
    """``spec.secretEnv``'s variables, each from ``environ``'s variable of the same name: local mode reads
    no Secrets. Every one that is not set is named at once, with the Secret and key it stands for."""
    missing = {name: split_secret_ref(ref) for name, ref in run.spec.secret_env.items() if name not in environ}
    if missing:
        named = ", ".join(
            f"{name} (key {key} of Secret {secret} on a cluster)" for name, (secret, key) in missing.items()
        )
        exports = "; ".join(f"export {name}=..." for name in missing)
        raise SpotrayError(
            f"spec.secretEnv names {named}, and this process's environment has no {' nor '.join(missing)}: "
            "local mode reads no Secrets and takes each variable from its own environment",
            f"`{exports}` with the value that key holds, then run the same command again",
        )
    return {name: environ[name] for name in run.spec.secret_env}


def machine_gpus() -> int:
    """The GPUs this machine's PyTorch sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    try:
        import torch  # noqa: PLC0415 - local mode has [train]; the light CLI does not load torch for this
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def local_gpus(workers: WorkerSpec, field: str, available: int, *, why_cpu: str = "") -> int:
    """The GPUs a local run gives its Ray cluster: every GPU its workers ask (``gpu`` per pod, for each
    replica), refused with the numbers when the machine has fewer, or when ``why_cpu`` says this run
    trains on CPU whatever the machine has."""
    wanted = workers.gpu * workers.replicas
    if not wanted:
        return 0
    if why_cpu:
        raise SpotrayError(f"{field} is {workers.gpu}, but {why_cpu}", f"set {field}: 0 to run it locally")
    if wanted > available:
        raise SpotrayError(
            f"{field} is {workers.gpu} for {workers.replicas} worker pod(s), {wanted} GPUs in all, but this machine "
            f"has {available} (torch.cuda.device_count())",
            f"set {field}: 0 to train on CPU here (the cluster manifest may keep its GPUs)",
        )
    return wanted


def ray_cpus_for(run: TrainingRun) -> int:
    """Enough logical CPUs for every worker (Ray may oversubscribe a small machine; that is fine here)."""
    needed = math.ceil(run.spec.workers.num_workers * run.spec.workers.cpu_per_worker)
    return max(needed, os.cpu_count() or 1)


def start_worker_node(cluster: LocalRayCluster, cpus: int, schedule: NodeSchedule) -> LocalRayWorkerNode:
    """The worker node of a new attempt's cluster. The schedule hears of it once the node is up: a
    loss given in seconds counts from then, as after a return, not from before a start that takes
    seconds."""
    node = cluster.add_worker_node(cpus)
    schedule.new_cluster(time.monotonic())
    return node


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The end of a log, at most ``chars``, from a whole line; empty when there is no log."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(size - chars, 0))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    if size > chars:
        text = text.partition("\n")[2]
    return text.strip()


def driver_message(code: int, log: Path) -> str:
    """How a driver ended, as a RayJob's message says it on a cluster: its exit code, then its last
    words, where a driver that left no record of how it ended (a store that did not answer) said why."""
    tail = log_tail(log)
    return f"the driver exited with code {code} (log: {log})" + (f", which ends with:\n{tail}" if tail else "")


def pause_before_next_attempt(end: AttemptEnd, decided: Plan) -> float:
    """Seconds local mode waits before the next attempt: the controller's backoff after an
    infrastructure fault, none after a preemption or a failure (see the module docstring)."""
    if end.outcome == OUTCOME_INTERRUPTED and decided.requeue_after_s:
        return decided.requeue_after_s
    return 0.0


class LocalRun:
    """One TrainingRun run locally; ``run()`` returns the exit code for the command line."""

    def __init__(
        self, run: TrainingRun, workdir: Path, faults: Faults, *, progress: ProgressView, keep_ray_cluster: bool = True
    ) -> None:
        cpu_only = "runs with node faults train on CPU here (the lost node has no GPU)" if faults.nodes.losses else ""
        # PyTorch is imported to count GPUs only for a run that asks for some (a CPU run's CLI stays light).
        available = machine_gpus() if run.spec.workers.gpu else 0
        self.gpus = local_gpus(run.spec.workers, "spec.workers.gpu", available, why_cpu=cpu_only)
        self.run_spec = run
        self.workdir = workdir.resolve()
        self.faults = faults
        self.progress = progress
        self.tally = RunTally()
        self.events_path = self.workdir / "events.jsonl"
        self.s3_env: dict[str, str] = {}
        # Checked before anything starts, like the node layout below.
        self.secret_env = secret_env_from(run, os.environ)
        self.store_config = StoreConfig.from_env()
        self.reaper = Reaper()
        # Checked before anything starts: a schedule the run cannot live through is refused here.
        self.node_layout: NodeLayout = faults.nodes.check(run.spec.workers)
        # The next attempt runs on the Ray cluster the last one left standing (False: a new cluster
        # for every attempt, as before; bench/micro/local_recovery.py measures one against the other).
        self.keep_ray_cluster = keep_ray_cluster
        self.cluster: LocalRayCluster | None = None
        # A driver that got SIGTERM (a spot notice, Ctrl-C) drained every node of its cluster for
        # preemption, and Ray never takes a drained node back: such a cluster is not kept.
        self.cluster_drained = False
        self.node: LocalRayWorkerNode | None = None  # the worker node of a run with node faults, while up
        # spec.workers.spareReplicas's nodes, one worker's CPUs each, started once the group trains.
        self.spares: list[LocalRayWorkerNode] = []
        # The preStop hook of a worker node's spot notice, and when it was given (--worker-notice-s).
        self.node_notice: tuple[subprocess.Popen[bytes], float] | None = None

    def run(self) -> int:
        self.workdir.mkdir(parents=True, exist_ok=True)
        run_id, state = self._load_state()
        if state.phase in TERMINAL_PHASES:
            return self._already_over(state)
        # The watchdog outlives this process by a moment: whatever ends local mode, it ends what
        # local mode started (spotray/local/reaper.py).
        with self.reaper:
            return self._run_with_s3(run_id, state)

    def _run_with_s3(self, run_id: str, state: RunState) -> int:
        server = None
        try:
            if needs_embedded_s3(self.run_spec, dict(os.environ)):
                server = LocalS3Server(self.workdir / "s3", on_launch=self.reaper.watch_session).start()
                self.s3_env = server.env()
                self.store_config = server.config
                for uri in s3_uris(self.run_spec):
                    server.create_bucket(parse_uri(uri).bucket)
                self.progress.note(f"embedded S3 (SeaweedFS) at {server.endpoint_url}, data in {server.data_dir}")
            return self._attempts(run_id, state)
        finally:
            self._stop_cluster()  # before the S3 server: its workers may still be writing
            if server is not None:
                server.stop()

    def _attempts(self, run_id: str, state: RunState) -> int:
        run = self.run_spec
        if state.current is not None and state.current.outcome == OUTCOME_RUNNING:
            # The previous `spotray run` was stopped mid-attempt: no budget is spent on that.
            end = AttemptEnd(OUTCOME_SUSPENDED, REASON_INTERRUPTED, "the command running it was stopped")
            state = record_end(state, end, datetime.now(UTC))
        while True:
            why = "first attempt" if state.current is None else f"after attempt {state.current.attempt}"
            state = start_attempt(state, run, datetime.now(UTC), why).state
            self._save_state(run_id, state)
            assert state.current is not None
            attempt = AttemptId(run_id, state.current.attempt)
            try:
                code, disruption = self._one_attempt(attempt)
            except KeyboardInterrupt:
                end = AttemptEnd(OUTCOME_SUSPENDED, REASON_INTERRUPTED, "stopped on Ctrl-C or SIGTERM")
                self._save_state(run_id, record_end(state, end, datetime.now(UTC)))
                raise
            end = self._classify(attempt, code, disruption)
            decided = end_attempt(state, run, end, datetime.now(UTC))
            state = decided.state
            self._save_state(run_id, state)
            self.tally.attempts = attempt.attempt
            self.tally.preemptions, self.tally.failures = state.preemptions, state.failures
            if state.phase == SUCCEEDED:
                self._finish()
                return EXIT_OK
            if state.phase == FAILED:
                self.progress.note(state.message)
                self.progress.note(f"  log: {self._log_path(attempt.attempt)}")
                return EXIT_BAD_INPUT if state.failure_reason == REASON_BAD_INPUT else EXIT_FAILED
            pause = pause_before_next_attempt(end, decided)
            if pause:
                self.progress.note(state.message)  # what it waits for, since when, and how long
                time.sleep(pause)
            else:
                self.progress.note(f"attempt {attempt.attempt} {end.outcome.lower()} ({end.reason}): {end.message}")

    def _classify(self, attempt: AttemptId, code: int, disruption: str | None) -> AttemptEnd:
        """How the attempt ended, from its exit code and its records, as the controller decides it."""
        store = open_store(self.run_spec.spec.checkpoint.uri, self.store_config)
        job = RayJobView(
            job_status=JOB_SUCCEEDED if code == EXIT_OK and disruption is None else JOB_FAILED,
            deployment_status=DEPLOYMENT_COMPLETE,
            message=driver_message(code, self._log_path(attempt.attempt)),
            disruption=disruption,
            exit_code=code,
        )
        try:
            records = read_attempt_records(store, attempt)
        except SpotrayError as error:
            raise SpotrayError(
                f"attempt {attempt.attempt} ended (exit code {code}), but its records cannot be read: {error.problem}",
                "nothing was counted against the run's budgets; fix the storage and run the same command again",
            ) from error
        return classify_end(job, records)

    def _state_path(self) -> Path:
        return self.workdir / "run-state.json"

    def _load_state(self) -> tuple[str, RunState]:
        """This work directory's run: its id and status, or a new run when there is none (or another's)."""
        path = self._state_path()
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("run") == self.run_spec.name:
                return check_run_id(str(saved["run_id"])), RunState.from_status(saved["status"])
            self.progress.note(f"{path} is run {saved.get('run')!r}'s, not {self.run_spec.name!r}: starting a new run")
        return new_run_id("local"), RunState()

    def _save_state(self, run_id: str, state: RunState) -> None:
        path = self._state_path()
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({"run": self.run_spec.name, "run_id": run_id, "status": state.to_status()}))
        partial.replace(path)  # a kill mid-write leaves the previous state, never half a file

    def _already_over(self, state: RunState) -> int:
        where = self.workdir
        if state.phase == SUCCEEDED:
            self.progress.note(
                f"{self.run_spec.name} is already complete in {where} ({state.message}); nothing to train. "
                f"The final model is in {where / 'final'}; to train again, use another --workdir."
            )
            return EXIT_OK
        self.progress.note(
            f"{self.run_spec.name} already failed in {where}: {state.message}\n"
            f"To start over, fix the cause and use another --workdir (or delete {where})."
        )
        return EXIT_BAD_INPUT if state.failure_reason == REASON_BAD_INPUT else EXIT_FAILED

    def _log_path(self, attempt: int) -> Path:
        return self.workdir / f"attempt-{attempt}.log"

    def _one_attempt(self, attempt: AttemptId) -> tuple[int, str | None]:
        """Start a Ray cluster and the entrypoint for one attempt; watch it; inject faults.

        Returns (the driver's exit code, what was lost when the whole cluster was killed, else None).
        """
        context = RunContext(
            name=self.run_spec.name, run_id=attempt.run_id, attempt=attempt.attempt, spec=self.run_spec.spec
        )
        cursor = EventCursor(self.events_path)
        cursor.new_events()  # only this attempt's events from here on
        asked = time.monotonic()
        cluster, kept = self._cluster_for(attempt.attempt)
        # For the ledger and bench/micro/local_recovery.py: where an attempt's start-up went before the job's own
        # events. Written as the driver starts, once the cluster is there: the attempt began ray_start_s earlier.
        EventLog(self.events_path).emit(
            "attempt_begun",
            attempt=attempt.attempt,
            ray_cluster="kept" if kept else "new",
            ray_start_s=round(time.monotonic() - asked, 3),
        )
        env = self.driver_env(context, cluster.address)
        self.progress.start_attempt(attempt.attempt, self.run_spec.spec.entrypoint)
        with self._log_path(attempt.attempt).open("ab") as log_file:
            driver = subprocess.Popen(
                ["bash", "-c", self.run_spec.spec.entrypoint],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a head loss is one killpg
                preexec_fn=die_with_parent,  # noqa: PLW1509 - one prctl call, see its docstring
            )
            self.reaper.watch_session(driver.pid)
            try:
                code, disruption = self._watch(driver, cluster, cursor)
                self.cluster_drained |= code == EXIT_PREEMPTED  # a SIGTERM from anywhere drains it too
                return code, disruption
            except KeyboardInterrupt:
                self._stop_gracefully(driver)
                raise
            finally:
                if not self.keep_ray_cluster:
                    self._stop_cluster()

    def _cluster_for(self, attempt: int) -> tuple[LocalRayCluster, bool]:
        """The Ray cluster an attempt runs on, and whether it is kept: the one the last attempt left
        standing, else a new one.

        Ray ends a driver's actors and placement groups when the driver exits, so the next driver finds
        the cluster's CPUs free again. Only a cluster whose head is gone is replaced, with its worker node.
        """
        if self.cluster is not None and self.cluster.standing() and not self.cluster_drained:
            self.progress.note(f"attempt {attempt} runs on the Ray cluster still standing at {self.cluster.address}")
            return self.cluster, True
        self._stop_cluster()  # what is left of a lost or drained one: its temp dir, any node still up
        layout = self.node_layout
        self.cluster = LocalRayCluster(
            num_cpus=layout.head_cpus if layout.node_cpus else ray_cpus_for(self.run_spec),
            num_gpus=self.gpus,
            log_path=self.workdir / "ray.log",
            env={**self.s3_env, **self.secret_env},
            on_launch=self.reaper.watch_session,
        ).start()
        if layout.node_cpus:
            self.node = start_worker_node(self.cluster, layout.node_cpus, self.faults.nodes)
        return self.cluster, False

    def _stop_cluster(self) -> None:
        if self.node_notice is not None:
            hook, _ = self.node_notice
            hook.kill()
            hook.wait()
        if self.cluster is not None:
            self.cluster.stop()
        self.cluster, self.node, self.node_notice, self.cluster_drained = None, None, None, False
        self.spares = []  # stopped with their cluster

    def driver_env(self, context: RunContext, ray_address: str) -> dict[str, str]:
        """The environment of an attempt's driver: this process's, the S3 settings, ``spec.secretEnv``'s
        values and the run's context, which names the variables but holds none of their values."""
        env = {
            **os.environ,
            **self.s3_env,
            **self.secret_env,
            **context.to_env(),
            "RAY_ADDRESS": ray_address,
            EVENTS_ENV: str(self.events_path),
            "PYTHONUNBUFFERED": "1",
            # `python` in the entrypoint is this interpreter, with spotray installed.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if self.node_layout.node_cpus:
            # The node returns when the user said: look for it every few seconds, not Ray's 60.
            env.setdefault(RESIZE_CHECK_ENV, str(LOCAL_RESIZE_CHECK_S))
        return env

    def _watch(
        self,
        driver: subprocess.Popen[bytes],
        cluster: LocalRayCluster,
        cursor: EventCursor,
    ) -> tuple[int, str | None]:
        workers: dict[int, int] = {}
        step = 0
        head_lost_at: float | None = None
        while True:
            for event in cursor.new_events():
                self._on_event(event)
                if event["event"] == "worker_start":
                    workers[int(event["rank"])] = int(event["pid"])
                if event["event"] == "step":
                    step = int(event["step"])
                    self._start_spares(cluster)
                    lost = self._maybe_inject(step, driver, cluster, workers)
                    if lost is not None:
                        return driver.returncode, lost
            if driver.poll() is not None:
                for event in cursor.new_events():
                    self._on_event(event)
                return driver.returncode, None
            head_code = cluster.head_exit_code()
            if head_code is not None:
                head_lost_at = head_lost_at or time.monotonic()
                if time.monotonic() - head_lost_at >= HEAD_LOST_GRACE_S:
                    return self._stop_headless_driver(driver, head_code, step)
            elif self.node_layout.node_cpus:  # a run with node faults
                self.node = self._move_node(step, cluster, self.node)
            time.sleep(0.2)

    def _stop_headless_driver(self, driver: subprocess.Popen[bytes], head_code: int, step: int) -> tuple[int, str]:
        """SIGKILL a driver whose Ray head is gone (without its GCS it can only wait); returns its exit
        code and what was lost."""
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        log = self.workdir / "ray.log"
        lost = f"the Ray head exited (code {head_code}) under the attempt at step {step} (its log: {log})"
        self.progress.note(
            f"{lost}; its driver still waited on it {HEAD_LOST_GRACE_S:.0f} s later and was stopped: "
            "a lost node, so a new attempt on a new Ray cluster"
        )
        return driver.returncode, lost

    def _on_event(self, event: dict[str, Any]) -> None:
        self.progress.on_event(event)
        if event["event"] == "start" and isinstance(event.get("dataset_cache"), str):
            self.reaper.release_dataset_cache(event["dataset_cache"])

    def _stop_gracefully(self, driver: subprocess.Popen[bytes]) -> None:
        """Ctrl-C: treat it as a spot notice, so the run stops on a complete checkpoint and resumes next time."""
        self.progress.note("interrupted: asking for an emergency checkpoint before stopping (Ctrl-C again to kill)")
        driver.send_signal(signal.SIGTERM)
        self.cluster_drained = True
        try:
            driver.wait(timeout=DEFAULT_GRACE_SECONDS + 30)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()

    def _maybe_inject(
        self, step: int, driver: subprocess.Popen[bytes], cluster: LocalRayCluster, workers: dict[int, int]
    ) -> str | None:
        """Inject the fault due at ``step``; returns what was lost when it was the whole cluster (a node loss)."""
        faults = self.faults
        if faults.kill_worker_at is not None and step >= faults.kill_worker_at and workers:
            rank = max(workers)
            os.kill(workers[rank], signal.SIGKILL)
            self._injected(f"SIGKILL to Ray Train worker rank {rank} (pid {workers[rank]}) at step {step}")
            self.faults = replace(faults, kill_worker_at=None)
        elif faults.kill_all_at is not None and step >= faults.kill_all_at:
            os.killpg(driver.pid, signal.SIGKILL)
            cluster.kill()
            driver.wait()
            what = f"SIGKILL to the driver and the whole Ray cluster (head lost) at step {step}"
            self._injected(what)
            self.faults = replace(faults, kill_all_at=None)
            return what  # the node is gone: to the controller this is a preemption
        elif faults.preempt_at is not None and step >= faults.preempt_at:
            driver.send_signal(signal.SIGTERM)
            self.cluster_drained = True
            self._injected(f"SIGTERM to the driver (a spot notice) at step {step}")
            self.faults = replace(faults, preempt_at=None)
        return None

    def _start_spares(self, cluster: LocalRayCluster) -> None:
        """A run with node faults and ``spareReplicas`` gets its spare nodes once its group trains.

        Not before: Ray places a group on any node with room, and the group must hold the worker on
        the node the faults hit, as a cluster's group holds its spot workers. A spot notice to that
        node then finds a spare free, and a fixed-size run goes on there (train/hf/notice.py).
        """
        spares = self.run_spec.spec.workers.spare_replicas
        if not self.node_layout.node_cpus or len(self.spares) >= spares:
            return
        for index in range(len(self.spares), spares):
            host = f"127.0.0.{SPARE_HOST_FIRST + index}"
            self.spares.append(cluster.add_worker_node(self.node_layout.node_cpus, host=host))
            self.progress.note(f"a spare worker node up on {host} (spec.workers.spareReplicas)")

    def _move_node(
        self, step: int, cluster: LocalRayCluster, node: LocalRayWorkerNode | None
    ) -> LocalRayWorkerNode | None:
        """Lose the worker node, or bring it back, when the schedule says; returns the node if it is up."""
        schedule = self.faults.nodes
        now = time.monotonic()
        if node is not None and self.node_notice is not None:
            hook, noticed_at = self.node_notice
            if hook.poll() is None and now - noticed_at < schedule.notice_s:
                return node
            node.stop()  # the kubelet's SIGTERM once the preStop hook returned, or the notice ran out
            hook.kill()
            hook.wait()
            self.node_notice = None
            schedule.lost(time.monotonic())
            self._injected(f"SIGTERM to the worker node on {node.host}, {now - noticed_at:.1f} s after its notice")
            return None
        if node is not None and schedule.loss_due(step, now):
            if schedule.notice_s:
                self.node_notice = (node.start_notice(schedule.notice_s, self.workdir / "drain.log"), now)
                self._injected(f"a {schedule.notice_s} s spot notice to the worker node on {node.host} at step {step}")
                return node
            node.kill()
            schedule.lost(now)
            self._injected(f"SIGKILL to the worker node on {node.host} (its raylet and worker) at step {step}")
            return None
        if node is None and schedule.lost_since is not None and schedule.return_due(step, now):
            gone_s = now - schedule.lost_since
            node = cluster.add_worker_node(self.node_layout.node_cpus)
            schedule.returned(time.monotonic())
            self._injected(f"a worker node back on {node.host}, {gone_s:.0f} s after the loss, at step {step}")
        return node

    def _injected(self, what: str) -> None:
        self.tally.injected.append(what)
        self.progress.note(f"injected: {what}")

    def _finish(self) -> None:
        """Fetch the final model and say where it is and how to load it."""
        store = open_store(self.run_spec.spec.checkpoint.uri, self.store_config)
        final = latest_complete_checkpoint(store)
        if final is None:
            self.progress.note("finished, but no complete checkpoint is in the store")
            return
        local_dir = download_checkpoint(store, final, self.workdir / "final")
        lifetimes, first_event, last_event = split_lifetimes(read_events(self.events_path))
        spent = ledger(lifetimes, first_event or 0.0, last_event or 0.0)
        png = plot_loss_across_attempts(
            lifetimes, self.workdir / "loss.png", f"{self.run_spec.name}: {spent.summary()}"
        )
        self.progress.summary(self.tally, str(store.uri.join(final.prefix)), local_dir)
        self.progress.note(f"  loss curve           {png}")
        self.progress.note(f"  time                 {spent.summary()}")
        self.progress.note(f"  time lost            {spent.lost_summary()}")
