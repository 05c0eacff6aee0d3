"""``spotray watch RUN``: the progress line of ``spotray run --local``, fed from the TrainingRun's status.

It polls the status every 2 s and says what the controller did in between: an attempt preempted
or failed, a new attempt resuming from a checkpoint, a new checkpoint. It ends with the run:
exit code 0 when it succeeded, 1 when it failed. Ctrl-C stops the watching, never the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotray.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CommandFailedError
from spotray.output import parse_time
from spotray.progress import ProgressView

if TYPE_CHECKING:
    from spotray.kube import ClusterConnection

POLL_SECONDS = 2.0
# How long the API may stay unreachable (a control plane upgrade, a laptop's Wi-Fi) before giving up.
UNREACHABLE_GRACE_SECONDS = 60.0


def _first_line(message: str | None, limit: int = 160) -> str:
    """A status message fit for one line (the controller's may carry a log tail: `spotray status` shows it all)."""
    lines = (message or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _attempt_entry(status: dict[str, Any], attempt: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = status.get("attempts") or []
    return next((entry for entry in entries if entry.get("attempt") == attempt), {})


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
        status = run.get("status") or {}
        first = self.attempt is None
        self._report_ended_attempts(status, quiet=first)
        attempt = int(status.get("attempt") or 0)
        if attempt and attempt != self.attempt:
            entry = _attempt_entry(status, attempt)
            # Until the controller writes the attempt's history entry, the last checkpoint is where it resumes.
            last_checkpoint = (status.get("lastCheckpoint") or {}).get("step") if attempt > 1 else None
            resumed = entry.get("resumedFrom", last_checkpoint)
            start = f"resuming from checkpoint-{resumed}" if resumed else "starting fresh"
            self.view.start_attempt(attempt, f"RayJob {status.get('rayJob') or entry.get('rayJob', '-')}, {start}")
        self.attempt = attempt
        phase = status.get("phase")
        if phase != self.phase:
            message = _first_line(status.get("message"))
            self.view.note(f"phase {phase or '-'}" + (f": {message}" if message else ""))
            self.phase = phase
        self._report_progress(status)
        if phase == "Succeeded":
            self.view.note(
                f"succeeded; fetch the model with: spotray pull {self.name} -n {self.namespace} ./{self.name}-final"
            )
            return EXIT_OK
        if phase == "Failed":
            flags = f"{self.name} -n {self.namespace}"
            self.view.note(f"failed; see `spotray status {flags}` and `spotray logs {flags}`")
            return EXIT_FAILED
        return None

    def _report_ended_attempts(self, status: dict[str, Any], *, quiet: bool) -> None:
        for entry in status.get("attempts") or []:
            number, outcome = entry.get("attempt"), entry.get("outcome")
            if outcome in (None, "Running") or number in self.seen_ends:
                continue
            self.seen_ends.add(number)
            if quiet:
                continue  # history from before we started watching: `spotray status RUN` shows it
            reason = entry.get("reason") or entry.get("message") or ""
            self.view.note(f"attempt {number} {outcome.lower()}" + (f" ({reason})" if reason else ""))
            if outcome == "Preempted":
                self.view.note(f"  a new attempt will resume from the last checkpoint ({self.checkpoint or 'none'})")

    def _report_progress(self, status: dict[str, Any]) -> None:
        checkpoint = status.get("lastCheckpoint") or {}
        if checkpoint.get("step") is not None and checkpoint["step"] != self.checkpoint:
            self.checkpoint = int(checkpoint["step"])
            self.view.on_event({"event": "checkpoint_complete", "step": self.checkpoint, "uri": checkpoint.get("uri")})
        progress = status.get("progress") or {}
        step, loss = progress.get("step"), progress.get("loss")
        if step is not None and loss is not None and step != self.step:
            self.step = int(step)
            when = parse_time(progress.get("updateTime"))
            self.view.on_event(
                {
                    "event": "step",
                    "step": self.step,
                    "max_steps": progress.get("totalSteps") or 0,
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
