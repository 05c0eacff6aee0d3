"""Chaos campaign, full runs: a real ``spotray run --local`` hit by faults at random steps.

Each trial trains the GPT-2 job (jobs/gpt2: 2 Ray Train workers, ``MAX_STEPS`` steps, a checkpoint
every ``INTERVAL``) with its own embedded S3 server and Ray cluster, and injects one or two of:

- ``kill-worker``: SIGKILL one Ray Train worker (Ray Train starts a new worker group in the attempt);
- ``kill-worker-starting``: as ``kill-worker``, then SIGKILL a worker of the new group at a random
  moment of its start-up (0-3 s after it starts: downloading the checkpoint, building the dataset or
  the model), which must not stop the group after it from coming back;
- ``kill-driver``: SIGKILL the job's driver process (the attempt fails: one of ``maxFailures``);
- ``kill-head``: the driver and the whole Ray cluster SIGKILLed, as when the head's node is lost
  (local mode's ``--kill-all-at``: one of ``maxPreemptions``);
- ``spot-notice``: SIGTERM to the driver (``--preempt-at``: an emergency checkpoint, a preemption);
- ``kill-upload``: SIGKILL the checkpoint upload process (replaced; the checkpoint still lands);
- ``s3-outage``: the S3 server frozen (SIGSTOP) for ``OUTAGE_S`` seconds, then let go;
- ``stop-cli-term``, ``stop-cli-hup``, ``stop-cli-kill``: SIGTERM, SIGHUP or SIGKILL to the
  ``spotray run`` command itself; then the same command again in the same work directory. A trial has
  at most one, and it comes first.

Checked against an uninterrupted run of the same job, made first:
- the run ends Succeeded (exit code 0, ``run-state.json``);
- a stopped ``spotray run`` leaves no process of the trial alive (read from /proc) within
  ``LEFTOVER_GRACE_S``, and a finished run leaves no shared memory registered for its dataset cache;
- the budgets spent are the faults injected (preemptions and failures, each by kind);
- every step's batch is the uninterrupted run's: no sample trained twice, none skipped;
- the final weights are the uninterrupted run's (up to ``WEIGHT_TOLERANCE``: float noise);
- every restart resumed from the newest checkpoint that was complete when it was hit (nothing
  complete is lost), and after a spot notice from its emergency checkpoint (nothing lost at all;
  a notice acted on that made none fails the run, unless S3 was down: ``restart_problems``).
Steps lost per restart are reported by fault kind.

The faults this script injects itself find their process by an environment marker that every
process of the trial inherits (``SPOTRAY_CHAOS_TRIAL``), so nothing outside the trial is touched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from spotray.contract.attempts import EXIT_OK
from spotray.contract.names import SUCCEEDED
from spotray.local.local_run import EventCursor
from spotray.train.hf.data import trained_batches
from spotray.train.hf.streaming_memory import owns, registrations
from spotray.train.records.event_log import read_events

MAX_STEPS = 40
INTERVAL = 10  # steps between checkpoints
BATCH = 8
OUTAGE_S = 30.0
WEIGHT_TOLERANCE = 1e-3
TRIAL_TIMEOUT_S = 900
LEFTOVER_GRACE_S = 60.0  # how long a stopped run's processes may take to end
STARTUP_KILL_WINDOW_S = 3.0  # a worker in start-up is killed this long after its start, at most
MARKER = "SPOTRAY_CHAOS_TRIAL"

# (preemptions, failures) each fault spends: the product's promise, written down once.
BUDGET_SPENT: dict[str, tuple[int, int]] = {
    "kill-worker": (0, 0),
    "kill-driver": (0, 1),
    "kill-head": (1, 0),
    "spot-notice": (1, 0),
    "kill-upload": (0, 0),
    "s3-outage": (0, 0),
    "kill-worker-starting": (0, 0),
    # A stopped `spotray run` records the attempt as interrupted: no budget (spotray/local/local_run.py).
    "stop-cli-term": (0, 0),
    "stop-cli-hup": (0, 0),
    "stop-cli-kill": (0, 0),
}
FULL_RUN_KINDS = sorted(BUDGET_SPENT)
CLI_FAULTS = {"kill-head": "--kill-all-at", "spot-notice": "--preempt-at"}  # local mode injects these itself
CLI_STOPS = {"stop-cli-term": signal.SIGTERM, "stop-cli-hup": signal.SIGHUP, "stop-cli-kill": signal.SIGKILL}

MANIFEST = """\
apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata:
  name: chaos-run
spec:
  entrypoint: python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size {batch} --workdir {job_dir}
  workers: {{replicas: 2, cpu: "1", memory: 2Gi, gpu: 0}}
  checkpoint: {{uri: "s3://chaos/runs/chaos-run", everySteps: {interval}, keep: 2}}
  data: {{uri: "s3://chaos/datasets/gpt2-bytes"}}
  retry: {{maxPreemptions: 5, maxFailures: 3, backoffSeconds: 1}}
"""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int


@dataclass
class RunResult:
    """What one full run left behind, read back after it ended."""

    workdir: Path
    exit_code: int
    seconds: float
    injected: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)  # processes alive after a stopped leg, then killed

    @property
    def state(self) -> dict[str, Any]:
        path = self.workdir / "run-state.json"
        return json.loads(path.read_text())["status"] if path.exists() else {}

    def batches(self) -> dict[int, list[int]]:
        return trained_batches(self.workdir / "samples")

    def weights(self) -> dict[str, torch.Tensor]:
        return load_file(self.workdir / "final" / f"checkpoint-{MAX_STEPS}" / "model.safetensors")

    def log_tail(self) -> str:
        path = self.workdir / "cli.log"
        return path.read_text()[-1500:] if path.exists() else ""


def schedule(rng: random.Random, choices: list[str], lead: str | None = None) -> list[Fault]:
    """One or two faults of ``choices`` at distinct random steps (``lead`` among them when given); each
    local-mode fault at most once, and at most one stop of the command, first (the second command gets
    the rest)."""
    count = rng.choice([1, 1, 2])
    kinds: list[str] = [lead] if lead else []
    while len(kinds) < count:
        kind = rng.choice(choices)
        if (kind in CLI_FAULTS and kind in kinds) or (kind in CLI_STOPS and any(k in CLI_STOPS for k in kinds)):
            continue
        kinds.append(kind)
    kinds.sort(key=lambda kind: kind not in CLI_STOPS)
    # A stop comes early enough to land before training ends (a checkpoint interval before the last step).
    steps = sorted(rng.sample(range(3, MAX_STEPS - INTERVAL), count))
    return [Fault(kind, step) for kind, step in zip(kinds, steps, strict=True)]


# ------------------------------------------------------------------------------- the processes


def trial_processes(token: str) -> Iterator[tuple[int, str]]:
    """(pid, command line) of every live process carrying this trial's marker."""
    wanted = f"{MARKER}={token}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or not ours


def find_process(token: str, needle: str) -> int | None:
    """The trial's process whose program (a module run with -m, or a binary) is ``needle``."""
    for pid, cmdline in trial_processes(token):
        words = cmdline.split()
        if words and (Path(words[0]).name == needle or f"-m {needle}" in cmdline) and Path(words[0]).name != "bash":
            return pid
    return None


def signal_quietly(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


class Injector:
    """Injects this script's own faults when the run reaches their step (local mode does the others)."""

    def __init__(self, token: str, faults: list[Fault], rng: random.Random) -> None:
        self.token = token
        self.rng = rng
        self.pending = [fault for fault in faults if fault.kind not in CLI_FAULTS]
        self.workers: dict[int, int] = {}  # rank -> pid, from the newest worker group's worker_start events
        self.injected: list[str] = []
        self.timers: list[threading.Timer] = []
        self.cli_pid: int | None = None  # the running `spotray run`, for the stop faults
        self.stopped_cli = False
        self.kill_next_starting: Fault | None = None  # kill-worker-starting, waiting for the next group

    def on_event(self, event: dict[str, Any]) -> None:
        if event["event"] == "worker_start":
            self.workers[int(event["rank"])] = int(event["pid"])
            if self.kill_next_starting is not None:
                self._kill_during_start_up(self.kill_next_starting, int(event["pid"]))
                self.kill_next_starting = None
        due = event["event"] == "step" and self.pending and int(event["step"]) >= self.pending[0].step
        if due and self._inject(self.pending[0], int(event["step"])):
            self.pending.pop(0)

    def _kill_during_start_up(self, fault: Fault, pid: int) -> None:
        delay = self.rng.uniform(0, STARTUP_KILL_WINDOW_S)

        def kill() -> None:
            if signal_quietly(pid, signal.SIGKILL):
                self.injected.append(f"{fault.kind} at step {fault.step} (then pid {pid}, {delay:.1f} s into start-up)")

        timer = threading.Timer(delay, kill)
        timer.start()
        self.timers.append(timer)

    def _inject(self, fault: Fault, step: int) -> bool:
        pid: int | None
        if fault.kind in CLI_STOPS:
            if self.cli_pid is None or not signal_quietly(self.cli_pid, CLI_STOPS[fault.kind]):
                return False
            self.stopped_cli = True
            self.injected.append(f"{fault.kind} at step {step}")
            return True
        if fault.kind in ("kill-worker", "kill-worker-starting"):
            pid = self.workers.get(max(self.workers)) if self.workers else None
        elif fault.kind == "kill-driver":
            pid = find_process(self.token, "spotray.jobs.gpt2")
        elif fault.kind == "kill-upload":
            pid = find_process(self.token, "spotray.train.checkpoints.upload_worker")
        else:  # s3-outage
            pid = find_process(self.token, "weed")
        if pid is None:
            return False  # not up yet (or between worker groups): try again at the next step
        if fault.kind == "s3-outage":
            if not signal_quietly(pid, signal.SIGSTOP):
                return False
            timer = threading.Timer(OUTAGE_S, signal_quietly, (pid, signal.SIGCONT))
            timer.start()
            self.timers.append(timer)
        elif not signal_quietly(pid, signal.SIGKILL):
            return False
        if fault.kind == "kill-worker-starting":
            self.kill_next_starting = fault  # counted as injected when the second kill lands
            return True
        self.injected.append(f"{fault.kind} at step {step} (pid {pid})")
        return True

    def release(self) -> None:
        """Let a frozen S3 server go now and drop start-up kills not yet made (the leg or trial is over)."""
        for timer in self.timers:
            if timer.is_alive():  # not fired yet; a fired one's pid may belong to another process by now
                timer.cancel()
                if timer.function is signal_quietly:  # the outage's end
                    timer.function(*timer.args)
        self.timers = []


def run_local(
    workdir: Path,
    faults: list[Fault],
    token: str,
    rng: random.Random | None = None,
    manifest_text: str | None = None,
    timeout_s: float = TRIAL_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
) -> RunResult:
    """``spotray run chaos.yaml --local`` in ``workdir``, with ``faults``; waits for it to end.

    ``extra_args``: more flags for every leg of the command (local mode's node faults).

    When a fault stops the command, waits for the trial's processes to end (killing and reporting any
    still alive after ``LEFTOVER_GRACE_S``) and runs the same command again, with the faults left.
    ``manifest_text``: another TrainingRun than the campaign's, a template as ``MANIFEST`` is.
    """
    workdir.mkdir(parents=True)
    manifest = workdir / "chaos.yaml"
    template = manifest_text or MANIFEST
    manifest.write_text(template.format(max_steps=MAX_STEPS, batch=BATCH, interval=INTERVAL, job_dir=workdir / "job"))
    base = [
        sys.executable,
        "-m",
        "spotray.cli",
        "run",
        str(manifest),
        "--local",
        "--workdir",
        str(workdir),
        *extra_args,
    ]
    env = {**os.environ, MARKER: token, "SPOTRAY_SAMPLE_LOG": str(workdir / "samples"), "PYTHONUNBUFFERED": "1"}
    injector = Injector(token, faults, rng or random.Random(0))
    cursor = EventCursor(workdir / "events.jsonl")
    stops = any(fault.kind in CLI_STOPS for fault in faults)
    local_mode_faults = [arg for f in faults if f.kind in CLI_FAULTS for arg in (CLI_FAULTS[f.kind], str(f.step))]
    started = time.monotonic()
    left_behind: list[str] = []
    with (workdir / "cli.log").open("wb") as log:
        # Local mode's own faults go to the command that is not stopped: a stop comes first.
        code = run_leg(base + ([] if stops else local_mode_faults), env, log, injector, cursor, started, timeout_s)
        if injector.stopped_cli:
            left_behind = wait_for_trial_to_end(token)
            code = run_leg(base + local_mode_faults, env, log, injector, cursor, started, timeout_s)
    output = (workdir / "cli.log").read_text(errors="replace")
    by_cli = [line.split("injected:", 1)[1].strip() for line in output.splitlines() if "injected:" in line]
    return RunResult(workdir, code, time.monotonic() - started, injector.injected + by_cli, left_behind)


def run_leg(
    command: list[str],
    env: dict[str, str],
    log: Any,
    injector: Injector,
    cursor: EventCursor,
    started: float,
    timeout_s: float = TRIAL_TIMEOUT_S,
) -> int:
    """One ``spotray run``, with the injector following its events; its exit code."""
    cli = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    injector.cli_pid = cli.pid
    try:
        while cli.poll() is None:
            if time.monotonic() - started > timeout_s:
                os.killpg(cli.pid, signal.SIGKILL)  # its reaper then ends what it started
                cli.wait()
                break
            for event in cursor.new_events():
                injector.on_event(event)
            time.sleep(0.1)
    finally:
        injector.cli_pid = None
        injector.release()
    return cli.returncode


def wait_for_trial_to_end(token: str) -> list[str]:
    """Wait until no process of the trial is alive; the command lines of those still alive after the
    grace (then killed, so that the next leg starts clean)."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while time.monotonic() < deadline:
        if not any(True for _ in trial_processes(token)):
            return []
        time.sleep(0.5)
    leftovers = list(trial_processes(token))
    for pid, _ in leftovers:
        signal_quietly(pid, signal.SIGKILL)
    return [f"{pid}: {command[:120]}" for pid, command in leftovers]


def shared_memory_left(result: RunResult) -> list[int]:
    """Streaming prefixes still registered for the run's dataset cache."""
    cache = result.workdir / "job" / "chaos-run" / "mds-cache"
    return [r.prefix for r in registrations() if any(owns(cache, local_dir) for local_dir in r.local_dirs)]


# ------------------------------------------------------------------------------- the checks


def restarts(events_path: Path) -> list[dict[str, Any]]:
    """Each time training started again: the step reached, the resume point, what was complete then,
    and the step where the attempt before it acted on a spot notice (``noticed``, None: no notice)."""
    found = []
    reached, complete, emergency, noticed, started = 0, 0, None, None, False
    for event in read_events(events_path):
        kind = event["event"]
        if kind == "step":
            reached = max(reached, int(event["step"]))
        elif kind == "checkpoint_complete":
            complete = max(complete, int(event["step"]))
        elif kind == "emergency_checkpoint":
            emergency = int(event["step"])
        elif kind == "preemption_notice":
            noticed = int(event["step"])
        elif kind == "start":
            if started:
                resumed = int(event["resumed_from"] or 0)
                found.append(
                    {"reached": reached, "resumed": resumed, "complete": complete, "emergency": emergency,
                     "noticed": noticed}
                )  # fmt: skip
                complete = max(complete, emergency or 0)
                reached, emergency, noticed = resumed, None, None
            started = True
    return found


def restart_problems(found: list[dict[str, Any]], faults: list[Fault]) -> list[str]:
    """What the restarts (``restarts``) broke: a resume older than the newest complete checkpoint, one
    that is not the emergency checkpoint, or a notice acted on that left no emergency checkpoint.

    The last is allowed only in a run with an S3 outage: a store that is down for longer than the
    drain deadline cannot make the emergency checkpoint safe, and the newest complete one is then
    the resume point (chaos run 6 of 2026-11-29: the notice at step 28 of attempt 1, S3 down since
    step 22, resumed from checkpoint-10).
    """
    problems = []
    outage = any(fault.kind == "s3-outage" for fault in faults)
    for restart in found:
        if restart["resumed"] < restart["complete"]:
            problems.append(f"resumed from {restart['resumed']}, but checkpoint-{restart['complete']} was complete")
        if restart["emergency"] is not None and restart["resumed"] != restart["emergency"]:
            problems.append(f"resumed from {restart['resumed']}, not the emergency checkpoint {restart['emergency']}")
        if restart["noticed"] is not None and restart["emergency"] is None and not outage:
            problems.append(
                f"the spot notice acted on at step {restart['noticed']} left no emergency checkpoint "
                f"(resumed from {restart['resumed']}, {restart['reached'] - restart['resumed']} steps lost)"
            )
    return problems


def budgets_due(result: RunResult, faults: list[Fault]) -> tuple[tuple[int, int], list[str]]:
    """(preemptions, failures) the faults must spend, and the problems seen working it out.

    A spot notice that reaches the driver after the last step stops nothing: the job finishes, the
    attempt succeeds and spends no budget, as on a cluster. The training acts on a notice it gets in
    time (a ``preemption_notice`` event); one it never acts on is allowed only when it was sent in
    the last checkpoint interval, where the remaining steps can take less time than the signal.
    """
    acted = sum(1 for e in read_events(result.workdir / "events.jsonl") if e["event"] == "preemption_notice")
    preemptions = failures = 0
    problems = []
    for fault in faults:
        if fault.kind == "spot-notice" and not acted:
            if fault.step < MAX_STEPS - INTERVAL:
                problems.append(f"the spot notice at step {fault.step} was never acted on")
            continue
        preemptions += BUDGET_SPENT[fault.kind][0]
        failures += BUDGET_SPENT[fault.kind][1]
    return (preemptions, failures), problems


def judge(result: RunResult, faults: list[Fault], reference: RunResult) -> list[str]:
    """Every broken promise of this run, as sentences; empty when it kept them all."""
    problems = []
    state = result.state
    if result.exit_code != EXIT_OK or state.get("phase") != SUCCEEDED:
        return [f"exit code {result.exit_code}, phase {state.get('phase')}: {result.log_tail()}"]
    if result.left_behind:
        problems.append(f"alive {LEFTOVER_GRACE_S:.0f} s after the command was stopped: {result.left_behind}")
    if leaked := shared_memory_left(result):
        problems.append(f"shared memory still registered for the dataset cache: prefixes {leaked}")
    if len(result.injected) != len(faults):
        problems.append(f"injected {result.injected}, planned {[f.kind for f in faults]}")
    want, late = budgets_due(result, faults)
    problems += late
    spent = (int(state.get("preemptions", 0)), int(state.get("failures", 0)))
    if spent != want:
        problems.append(f"budgets spent (preemptions, failures) {spent}, the faults account for {want}")
    batches, expected = result.batches(), reference.batches()
    if batches != expected:
        wrong = [step for step in expected if batches.get(step) != expected[step]]
        ids = [i for step in range(1, MAX_STEPS + 1) for i in batches.get(step, [])]
        problems.append(
            f"batches differ from the uninterrupted run at steps {wrong[:10]}; "
            f"{len(ids) - len(set(ids))} samples trained twice"
        )
    final, baseline = result.weights(), reference.weights()
    worst = max(float((final[name] - baseline[name]).abs().max()) for name in baseline)
    if worst > WEIGHT_TOLERANCE:
        problems.append(f"final weights differ from the uninterrupted run's by up to {worst:.2e}")
    problems += restart_problems(restarts(result.workdir / "events.jsonl"), faults)
    return problems


def steps_lost(result: RunResult) -> list[int]:
    return [r["reached"] - r["resumed"] for r in restarts(result.workdir / "events.jsonl")]


def reference_run(work: Path) -> RunResult:
    """The uninterrupted run every trial is compared with."""
    result = run_local(work / "reference", [], f"reference-{os.getpid()}")
    if result.exit_code != 0:
        raise SystemExit(f"the uninterrupted reference run failed (exit code {result.exit_code}):\n{result.log_tail()}")
    return result


@dataclass(frozen=True)
class FullRun:
    faults: list[Fault]
    injected: list[str]
    problems: list[str]
    steps_lost: list[int]
    seconds: float


def full_run_trial(
    work: Path, number: int, rng: random.Random, reference: RunResult, choices: list[str] = FULL_RUN_KINDS
) -> FullRun:
    """Run ``number`` of a campaign: the kinds of ``choices`` take turns leading, so that a campaign of at
    least ``len(choices)`` runs tries each (drawn at random, 12 runs of all ten kinds missed three)."""
    faults = schedule(rng, choices, lead=choices[number % len(choices)])
    result = run_local(work / f"run-{number}", faults, f"run-{number}-{os.getpid()}", rng)
    try:
        problems = judge(result, faults, reference)
    except (OSError, KeyError, ValueError) as error:  # a missing final model, a torn state file
        problems = [f"could not read what the run left: {type(error).__name__}: {error}"]
    lost = steps_lost(result) if (result.workdir / "events.jsonl").exists() else []
    return FullRun(faults, result.injected, problems, lost, result.seconds)
