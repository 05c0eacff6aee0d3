"""``spotray run SWEEP --local``: a TrainingSweep on this machine, its trials as local runs.

Each trial is ``spotray run <trial>.yaml --local`` in a process of its own, with a work directory of
its own (``<workdir>/<sweep>-t<N>``) and its own Ray cluster; one embedded S3 server (or the
configured endpoint) serves them all. What to do next is decided by the controller's own function
(spotray/decisions/sweep_plan.py ``decide``) from what the trials' event logs say: their losses, the
checkpoints they completed, how they ended. A trial stopped at a rung gets SIGTERM, which a local
run takes as a spot notice (an emergency checkpoint, then it stops, Suspended); a trial promoted
later is the same command run again, which resumes it from its newest complete checkpoint.

Population-based training works the same way: a trial that exploits another gets SIGTERM, and once
it stopped it is started again with the new values and ``checkpoint.startFrom`` naming the donor's
checkpoint, which its job copies into its own prefix before it resumes (train/checkpoints/start_from.py).

The sweep's own state (each trial's values, the rungs it was let past, which trials it suspended, the
exploits) is ``<workdir>/sweep-state.json``: the same command run again goes on where the sweep stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotray.contract.names import FAILED as RUN_FAILED
from spotray.contract.names import SUCCEEDED as RUN_SUCCEEDED
from spotray.contract.spec import TrainingRun
from spotray.contract.sweep import Exploit, TrainingSweep, format_value, gpu_hours, interval_mean, objective_values
from spotray.contract.uris import parse_uri
from spotray.decisions.sweep_plan import SweepPlan, decide
from spotray.decisions.sweep_trials import FAILED, RUNNING, SUCCEEDED, SUSPENDED, TrialFacts
from spotray.local.local_run import local_gpus, needs_embedded_s3
from spotray.local.progress import ProgressView
from spotray.local.reaper import Reaper
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server

DECIDE_EVERY_S = 1.0
# A trial whose command keeps ending before its run does (it cannot even start) fails after this many.
MAX_UNASKED_EXITS = 3


@dataclass
class TrialProcess:
    number: int
    process: subprocess.Popen[bytes]
    stopping: bool = False  # sent SIGTERM: stopping at a rung


@dataclass
class SweepState:
    """What the sweep decided that the trials' own records do not say."""

    values: dict[int, dict[str, Any]] = field(default_factory=dict)
    promoted: dict[int, int] = field(default_factory=dict)  # trial -> the highest rung step it was let past
    suspended: set[int] = field(default_factory=set)
    # (trial, step, stopped/promoted/exploited): what the plot marks
    decisions: list[tuple[int, int, str]] = field(default_factory=list)
    # Population-based training: the step each trial was last judged at, the exploit a trial was stopped
    # for (until it is started with it), the exploits applied (its lineage) and the checkpoint it starts from.
    judged: dict[int, int] = field(default_factory=dict)
    exploits: dict[int, Exploit] = field(default_factory=dict)
    lineage: dict[int, list[Exploit]] = field(default_factory=dict)
    start_from: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "values": {str(n): v for n, v in self.values.items()},
                "promoted": {str(n): r for n, r in self.promoted.items()},
                "suspended": sorted(self.suspended),
                "decisions": [list(d) for d in self.decisions],
                "judged": {str(n): step for n, step in self.judged.items()},
                "exploits": {str(n): e.to_json() for n, e in self.exploits.items()},
                "lineage": {str(n): [e.to_json() for e in exploits] for n, exploits in self.lineage.items()},
                "startFrom": {str(n): uri for n, uri in self.start_from.items()},
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> SweepState:
        data = json.loads(text)
        return cls(
            values={int(n): v for n, v in data["values"].items()},
            promoted={int(n): int(r) for n, r in data["promoted"].items()},
            suspended={int(n) for n in data["suspended"]},
            decisions=[(int(n), int(step), str(what)) for n, step, what in data.get("decisions", [])],
            judged={int(n): int(step) for n, step in data.get("judged", {}).items()},
            exploits={int(n): e for n, d in data.get("exploits", {}).items() if (e := Exploit.from_json(d))},
            lineage={
                int(n): [e for d in exploits if (e := Exploit.from_json(d))]
                for n, exploits in data.get("lineage", {}).items()
            },
            start_from={int(n): str(uri) for n, uri in data.get("startFrom", {}).items()},
        )


def losses_by_step(events: list[dict[str, Any]]) -> dict[int, float]:
    """Each step's loss; a step trained again after a resume keeps its latest loss (an exact resume gives
    the same one)."""
    return {int(e["step"]): float(e["loss"]) for e in events if e.get("event") == "step" and "loss" in e}


def attempt_seconds(events: list[dict[str, Any]]) -> float:
    """How long a trial's attempts ran, from its event log: each from its ``attempt_begun`` to its
    last event (a trial running now: to its latest, at most a step ago)."""
    total, begun, last = 0.0, None, None
    for event in events:
        at = float(event["time"])
        if event.get("event") == "attempt_begun":  # written once its Ray cluster is up: it began before
            if begun is not None and last is not None:
                total += last - begun
            begun = at - float(event.get("ray_start_s") or 0)
        last = at
    if begun is not None and last is not None:
        total += last - begun
    return total


def current_life(events: list[dict[str, Any]], start_from: str | None, donor_step: int) -> list[dict[str, Any]]:
    """A trial's events without the steps past ``donor_step`` of the life its newest exploit ended: those
    before its job copied ``start_from`` (none yet, while its new life starts), which it trains again."""
    copied = [i for i, e in enumerate(events) if e.get("event") == "started_from" and e.get("uri") == start_from]
    since = copied[-1] if copied else len(events)
    return [e for e in events[:since] if int(e.get("step") or 0) <= donor_step] + events[since:]


def complete_step(events: list[dict[str, Any]]) -> int:
    """The step of the newest complete checkpoint the log reports (0: none yet)."""
    return max((int(e["step"]) for e in events if e.get("event") == "checkpoint_complete"), default=0)


class LocalSweep:
    """One TrainingSweep run locally; ``run()`` returns the exit code for the command line."""

    def __init__(self, sweep: TrainingSweep, workdir: Path, *, progress: ProgressView) -> None:
        template = sweep.spec.template
        local_gpus(template.workers, "spec.template.workers.gpu", 0, why_cpu="local sweeps train on CPU")
        self.sweep = sweep
        self.workdir = workdir.resolve()
        self.progress = progress
        self.every = template.checkpoint.fixed_every_steps or 0
        self.processes: dict[int, TrialProcess] = {}
        self.unasked_exits: dict[int, int] = {}
        self.state = SweepState()
        self.env: dict[str, str] = {}
        self.reaper = Reaper()
        # As many trials at once as the sweep asks and the machine's CPUs hold (one Ray cluster each).
        per_trial = math.ceil(template.workers.num_workers * template.workers.cpu_per_worker)
        self.fits = max(1, (os.cpu_count() or 1) // max(1, per_trial))

    # -- the loop ------------------------------------------------------------------------------------

    def run(self) -> int:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._load_state()
        spec = self.sweep.spec
        if spec.trials.parallel > self.fits:
            self.progress.note(
                f"trials.parallel is {spec.trials.parallel}, and this machine's {os.cpu_count()} CPUs fit {self.fits} "
                f"trial(s) of {spec.template.workers.num_workers} worker(s): {self.fits} at a time"
            )
        # Trials stop before the watchdog's end (which SIGKILLs what is left) and before the S3 server.
        with self.reaper:
            server = self._embedded_s3()
            try:
                return self._loop()
            except KeyboardInterrupt:
                self.progress.note("interrupted: stopping every trial on a checkpoint; run the same command to go on")
                self._stop_all()
                raise
            finally:
                if server is not None:
                    server.stop()

    def _embedded_s3(self) -> LocalS3Server | None:
        """One S3 server for every trial, when none is configured (as local mode brings one for a run)."""
        template = self.sweep.spec.template
        if not needs_embedded_s3(TrainingRun(self.sweep.name, template, self.sweep.namespace), dict(os.environ)):
            return None
        server = LocalS3Server(self.workdir / "s3", on_launch=self.reaper.watch_session).start()
        self.env = server.env()
        for uri in (template.checkpoint.uri, template.data.uri):
            if uri and uri.startswith("s3://"):
                server.create_bucket(parse_uri(uri).bucket)
        self.progress.note(f"embedded S3 (SeaweedFS) at {server.endpoint_url}, data in {server.data_dir}")
        return server

    def _loop(self) -> int:
        spec = self.sweep.spec
        limited = dataclasses.replace(
            spec, trials=dataclasses.replace(spec.trials, parallel=min(spec.trials.parallel, self.fits))
        )
        while True:
            facts = self.trials()
            plan = decide(limited, facts)
            self._act(plan, facts)
            if plan.finished:
                return self._summary(facts, plan)
            time.sleep(DECIDE_EVERY_S)

    def _act(self, plan: SweepPlan, facts: list[TrialFacts]) -> None:
        for number, rung in plan.promoted.items():
            if self.state.promoted.get(number) != rung:
                self.state.promoted[number] = rung
                self.state.decisions.append((number, rung, "promoted"))
                self.progress.note(f"trial {number} goes on past step {rung} ({self._rung_text(facts, number, rung)})")
        for number in plan.suspend:
            running = self.processes.get(number)
            if running is not None and running.stopping:
                continue  # stopping already: it ends on its emergency checkpoint
            if running is not None:
                running.process.send_signal(signal.SIGTERM)  # a spot notice: it stops on a checkpoint
                running.stopping = True
            # (A trial with no process, the sweep having been stopped while it ran, is not started again.)
            self.state.suspended.add(number)
            rung = max(next(f for f in facts if f.number == number).rung_values)
            self.state.decisions.append((number, rung, "stopped"))
            self.progress.note(
                f"trial {number} stops at step {rung} ({self._rung_text(facts, number, rung)}: "
                "not among the best there); it may resume when more trials reach that step"
            )
        for number in plan.resume:
            self.state.suspended.discard(number)
            self._start(number, "resumes from its newest complete checkpoint")
        self._act_population(plan, facts)
        for number, values in plan.start:
            self.state.values[number] = values
            self._start(number, _values_text(values))
        # A trial that should be running but has no process (the sweep was stopped while it ran) starts again.
        for fact in facts:
            stopping = fact.number in plan.suspend or fact.number in plan.exploit
            if fact.state == RUNNING and fact.number not in self.processes and not stopping:
                self._start(fact.number, "goes on where it stopped")
        self._save_state()

    def _act_population(self, plan: SweepPlan, facts: list[TrialFacts]) -> None:
        """Population-based training: judged trials recorded, trials stopped for an exploit, and trials
        that stopped started again from their donor's checkpoint with their new values."""
        self.state.judged.update(plan.judged)
        for number, exploit in plan.exploit.items():
            running = self.processes.get(number)
            if running is not None and not running.stopping:
                running.process.send_signal(signal.SIGTERM)  # it stops on a checkpoint, then goes on from the donor's
                running.stopping = True
            self.state.exploits[number] = exploit
            self.state.judged[number] = exploit.step
            self.state.suspended.add(number)
            self.state.decisions.append((number, exploit.step, "exploited"))
            self.progress.note(
                f"trial {number} exploits trial {exploit.donor} at step {exploit.step} "
                f"({self._rung_text(facts, number, exploit.step)}, among the worst there): it goes on from trial "
                f"{exploit.donor}'s checkpoint-{exploit.donor_step} with {_values_text(exploit.values)}"
            )
        for number, exploit in plan.apply.items():
            self.state.values[number] = exploit.values
            self.state.start_from[number] = self.sweep.donor_checkpoint(exploit)
            self.state.lineage.setdefault(number, []).append(exploit)
            self.state.judged[number] = exploit.donor_step
            del self.state.exploits[number]
            self.state.suspended.discard(number)
            self._start(number, f"goes on from trial {exploit.donor}'s checkpoint-{exploit.donor_step}")

    def trials(self) -> list[TrialFacts]:
        """What each trial started so far is: its values, its state, its objective (read from its event log)."""
        return [self._facts(number) for number in sorted(self.state.values)]

    def _facts(self, number: int) -> TrialFacts:
        name = self.sweep.trial_name(number)
        events = list(read_events(self.workdir / name / "events.jsonl"))
        max_steps = max((int(e.get("max_steps") or 0) for e in events if e.get("event") == "start"), default=0)
        lineage = self.state.lineage.get(number)
        if lineage:
            events = current_life(events, self.state.start_from.get(number), lineage[-1].donor_step)
        losses = losses_by_step(events)
        steps = self.sweep.spec.objective_steps(max_steps)
        values = objective_values(losses, steps, complete_step(events), self.every) if steps else {}
        state, final = self._trial_state(number, events, losses)
        return TrialFacts(
            number,
            self.state.values[number],
            state,
            values,
            final,
            self.state.promoted.get(number),
            gpu_hours=gpu_hours(self.sweep.spec.template.workers, attempt_seconds(events)),
            judged_step=self.state.judged.get(number),
            exploit=self.state.exploits.get(number) if state in (RUNNING, SUSPENDED) else None,
            lineage=tuple(self.state.lineage.get(number, ())),
        )

    def _trial_state(
        self, number: int, events: list[dict[str, Any]], losses: dict[int, float]
    ) -> tuple[str, float | None]:
        running = self.processes.get(number)
        if running is not None and running.process.poll() is None:
            return RUNNING, None
        phase = self._phase(number)
        if running is not None:
            del self.processes[number]
            if phase not in (RUN_SUCCEEDED, RUN_FAILED) and not running.stopping:
                self._exited_unasked(number, running.process.returncode)
        if phase == RUN_SUCCEEDED:
            ends = [int(e["step"]) for e in events if e.get("event") == "end"]
            return SUCCEEDED, interval_mean(losses, ends[-1], self.every or 1) if ends else None
        if phase == RUN_FAILED or self.unasked_exits.get(number, 0) >= MAX_UNASKED_EXITS:
            return FAILED, None
        return (SUSPENDED, None) if number in self.state.suspended else (RUNNING, None)

    def _exited_unasked(self, number: int, code: int) -> None:
        """A trial's command ended before its run did, and the sweep had not stopped it: started again,
        up to MAX_UNASKED_EXITS times, then counted as failed (its log says why)."""
        self.unasked_exits[number] = self.unasked_exits.get(number, 0) + 1
        log = self.workdir / f"{self.sweep.trial_name(number)}.log"
        if self.unasked_exits[number] >= MAX_UNASKED_EXITS:
            self.progress.note(f"trial {number} exited {MAX_UNASKED_EXITS} times (last code {code}): failed; see {log}")
        else:
            self.progress.note(f"trial {number} exited with code {code} before its run ended; see {log}")

    def _phase(self, number: int) -> str | None:
        path = self.workdir / self.sweep.trial_name(number) / "run-state.json"
        try:
            return str(json.loads(path.read_text())["status"].get("phase"))
        except (OSError, ValueError, KeyError):
            return None

    def _start(self, number: int, why: str) -> None:
        name = self.sweep.trial_name(number)
        manifest = self.workdir / f"{name}.yaml"
        document = self.sweep.trial_manifest(number, self.state.values[number])
        if number in self.state.start_from:
            document["spec"]["checkpoint"]["startFrom"] = self.state.start_from[number]
        manifest.write_text(yaml.safe_dump(document))
        command = [
            sys.executable,
            "-m",
            "spotray.cli",
            "run",
            str(manifest),
            "--local",
            "--workdir",
            str(self.workdir / name),
        ]
        log = (self.workdir / f"{name}.log").open("ab")
        with log:
            process = subprocess.Popen(
                command, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.reaper.watch_session(process.pid)
        self.processes[number] = TrialProcess(number, process)
        self.progress.note(f"trial {number} ({name}) {why}; log: {self.workdir / f'{name}.log'}")

    def _stop_all(self) -> None:
        for running in self.processes.values():
            if running.process.poll() is None:
                running.process.send_signal(signal.SIGTERM)
        for running in self.processes.values():
            try:
                running.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(running.process.pid, signal.SIGKILL)
        self._save_state()

    # -- what it says ------------------------------------------------------------------------------

    def _rung_text(self, facts: list[TrialFacts], number: int, rung: int) -> str:
        value = next(f for f in facts if f.number == number).rung_values.get(rung)
        return f"{self.sweep.spec.objective.metric} {value:.4f}" if value is not None else "no value"

    def _summary(self, facts: list[TrialFacts], plan: SweepPlan) -> int:
        self.progress.note(f"\nsweep {self.sweep.name}: {len(facts)} trial(s) in {self.workdir}")
        for fact in facts:
            values = _values_text(fact.values)
            result = f"{self.sweep.spec.objective.metric} {fact.value:.4f}" if fact.value is not None else ""
            rungs = ", ".join(f"{step}: {value:.4f}" for step, value in sorted(fact.rung_values.items()))
            exploits = "; ".join(
                f"from trial {e.donor}'s step {e.donor_step} at {e.step} ({_values_text(e.before)} -> "
                f"{_values_text(e.values)})"
                for e in fact.lineage
            )
            self.progress.note(
                f"  t{fact.number:<3} {fact.state:<10} {values}  {result}"
                + (f"  (rungs {rungs})" if rungs and not exploits else "")
                + (f"  (exploited: {exploits})" if exploits else "")
            )
        budget = self.sweep.spec.trials.max_gpu_hours
        if budget is not None:
            spent = sum(f.gpu_hours for f in facts)
            said = ": no trial started or resumed past it" if plan.budget_spent else ""
            self.progress.note(f"GPU-hours spent: {spent:.3f} of {budget:g}{said}")
        png = self._plot()
        if png is not None:
            self.progress.note(f"loss curves: {png}")
        if plan.best is None:
            self.progress.note("no trial succeeded")
            return 1
        number, value = plan.best
        self.progress.note(
            f"best: trial {number} ({self.sweep.trial_name(number)}), {self.sweep.spec.objective.metric} {value:.4f}; "
            f"its model: {self.workdir / self.sweep.trial_name(number) / 'final'}"
        )
        return 0

    def _plot(self) -> Path | None:
        """Every trial's loss curve, each stop and promotion marked (needs spotray[plot])."""
        try:
            from spotray.train.records.plot import plot_sweep  # noqa: PLC0415 - matplotlib only when plotting
        except ImportError:
            return None
        curves = {}
        for number in sorted(self.state.values):
            events = read_events(self.workdir / self.sweep.trial_name(number) / "events.jsonl")
            curves[f"t{number}"] = sorted(losses_by_step(list(events)).items())
        marks = [(f"t{number}", step, what) for number, step, what in self.state.decisions]
        png = self.workdir / "sweep.png"
        return plot_sweep(curves, marks, png, f"sweep {self.sweep.name}: training loss of every trial")

    # -- state -------------------------------------------------------------------------------------

    def _state_path(self) -> Path:
        return self.workdir / "sweep-state.json"

    def _load_state(self) -> None:
        path = self._state_path()
        if path.exists():
            self.state = SweepState.from_json(path.read_text())
            self.progress.note(f"going on with sweep {self.sweep.name} from {path}")

    def _save_state(self) -> None:
        partial = self._state_path().with_suffix(".partial")
        partial.write_text(self.state.to_json())
        partial.replace(self._state_path())


def _values_text(values: dict[str, Any]) -> str:
    return " ".join(f"{name}={format_value(value)}" for name, value in values.items())
