"""``spotray watch RUN``: the progress line of ``spotray run --local``, fed from the TrainingRun's status.

It polls the status every 2 s and says what the controller did in between: an attempt preempted
or failed, a new attempt resuming from a checkpoint, a new checkpoint. It ends with the run:
exit code 0 when it succeeded, 1 when it failed. Ctrl-C stops the watching, never the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotray.cli.exit_codes import CommandFailedError
from spotray.cli.output import parse_time
from spotray.contract.attempts import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OUTCOME_INTERRUPTED,
    OUTCOME_PREEMPTED,
    OUTCOME_RUNNING,
)
from spotray.contract.names import FAILED, SUCCEEDED
from spotray.contract.status import LastCheckpoint, Progress, RunStatus
from spotray.local.progress import ProgressView

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection

POLL_SECONDS = 2.0
# How long the API may stay unreachable (a control plane upgrade, a laptop's Wi-Fi) before giving up.
UNREACHABLE_GRACE_SECONDS = 60.0


def _first_line(message: str | None, limit: int = 160) -> str:
    """A status message fit for one line (the controller's may carry a log tail: `spotray status` shows it all)."""
    lines = (message or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class StatusFollower:
    """Turns successive statuses of one TrainingRun into the view's notes and progress line."""

    view: ProgressView
    name: str
    namespace: str
    attempt: int | None = None
    phase: str | None = None
    checkpoint: int | None = None
    step: int | None = None
    seen_ends: set[int] = field(default_factory=set)

    def update(self, run: dict[str, Any]) -> int | None:
        """Report what changed; returns the exit code once the run has ended, else None."""
        status = RunStatus.of(run)
        first = self.attempt is None
        self._report_ended_attempts(status, quiet=first)
        attempt = status.attempt or 0
        if attempt and attempt != self.attempt:
            entry = status.attempt_entry(attempt)
            # Until the controller writes the attempt's history entry, the last checkpoint is where it resumes.
            last_checkpoint = status.last_checkpoint.step if attempt > 1 and status.last_checkpoint else None
            resumed = last_checkpoint if entry.resumed_from is None else entry.resumed_from
            start = f"resuming from checkpoint-{resumed}" if resumed else "starting fresh"
            self.view.start_attempt(attempt, f"RayJob {status.ray_job or entry.ray_job or '-'}, {start}")
        self.attempt = attempt
        phase = status.phase
        if phase != self.phase:
            message = _first_line(status.message)
            self.view.note(f"phase {phase or '-'}" + (f": {message}" if message else ""))
            self.phase = phase
        self._report_progress(status)
        if phase == SUCCEEDED:
            self.view.note(
                f"succeeded; fetch the model with: spotray pull {self.name} -n {self.namespace} ./{self.name}-final"
            )
            return EXIT_OK
        if phase == FAILED:
            flags = f"{self.name} -n {self.namespace}"
            self.view.note(f"failed; see `spotray status {flags}` and `spotray logs {flags}`")
            return EXIT_FAILED
        return None

    def _report_ended_attempts(self, status: RunStatus, *, quiet: bool) -> None:
        for entry in status.attempts or ():
            number, outcome = entry.attempt, entry.outcome
            if outcome in ("", OUTCOME_RUNNING) or number in self.seen_ends:
                continue
            self.seen_ends.add(number)
            if quiet:
                continue  # history from before we started watching: `spotray status RUN` shows it
            reason = entry.reason or entry.message
            self.view.note(f"attempt {number} {outcome.lower()}" + (f" ({reason})" if reason else ""))
            if outcome in (OUTCOME_PREEMPTED, OUTCOME_INTERRUPTED):  # neither spends maxFailures
                self.view.note(f"  a new attempt will resume from the last checkpoint ({self.checkpoint or 'none'})")

    def _report_progress(self, status: RunStatus) -> None:
        checkpoint = status.last_checkpoint or LastCheckpoint()
        if checkpoint.step is not None and checkpoint.step != self.checkpoint:
            self.checkpoint = int(checkpoint.step)
            self.view.on_event({"event": "checkpoint_complete", "step": self.checkpoint, "uri": checkpoint.uri})
        progress = status.progress or Progress()
        step, loss = progress.step, progress.loss
        if step is not None and loss is not None and step != self.step:
            self.step = int(step)
            when = parse_time(progress.update_time)
            self.view.on_event(
                {
                    "event": "step",
                    "step": self.step,
                    "max_steps": progress.total_steps or 0,
                    "loss": loss,
                    "time": when.timestamp() if when else time.time(),
                }
            )


def watch_run(cluster: ClusterConnection, name: str, poll_seconds: float = POLL_SECONDS) -> int:
    namespace = cluster.namespace
    view = ProgressView()
    follower = StatusFollower(view, name, namespace)
    view.note(f"watching TrainingRun {namespace}/{name} (context {cluster.context_name}); Ctrl-C stops watching only")
    unreachable_since: float | None = None
    try:
        while True:
            try:
                run = cluster.get_run(name)
            except CommandFailedError as error:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_GRACE_SECONDS:
                    raise
                view.note(f"  {error.problem}; retrying")
            else:
                unreachable_since = None
                code = follower.update(run)
                if code is not None:
                    return code
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        view.note(f"stopped watching; the run goes on (spotray status {name} -n {namespace})")
        return EXIT_INTERRUPTED
