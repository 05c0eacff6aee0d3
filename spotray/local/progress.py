"""A progress view for a training run, fed by its JSON-lines events.

On a terminal it redraws one line (attempt, step/total, bar, loss, steps/s, ETA, last checkpoint);
into a file or a CI log it prints a line per 10% and every notable event, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

BAR_WIDTH = 24


@dataclass
class RunTally:
    """What happened across a run's attempts, for the summary."""

    attempts: int = 0
    preemptions: int = 0
    failures: int = 0
    injected: list[str] = field(default_factory=list)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class ProgressView:
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    attempt: int = 0
    step: int = 0
    max_steps: int = 0
    loss: float | None = None
    last_checkpoint: int | None = None
    resumed_from: list[int] = field(default_factory=list)
    load_hint: str | None = None
    started: float = field(default_factory=time.monotonic)
    stalled_since: str | None = None  # checkpoint uploads stalled on a store fault since then (HH:MM:SS)
    _rate: list[tuple[float, int]] = field(default_factory=list)
    _last_decile: int = -1
    _line_open: bool = False

    @property
    def tty(self) -> bool:
        return self.stream.isatty()

    def note(self, text: str) -> None:
        self._end_line()
        print(text, file=self.stream, flush=True)

    def start_attempt(self, attempt: int, entrypoint: str) -> None:
        self.attempt = attempt
        self._rate.clear()
        self.note(f"attempt {attempt}: {entrypoint}")

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "start":
            self.max_steps = int(event.get("max_steps") or self.max_steps)
            resumed = event.get("resumed_from")
            self._rate.clear()
            if resumed:
                self.resumed_from.append(int(resumed))
                self.note(f"  resumed from checkpoint-{resumed} ({event.get('world_size')} workers)")
            else:
                self.note(f"  fresh start ({event.get('world_size')} workers)")
            for skipped in event.get("skipped_checkpoints") or []:
                self.note(f"  passed over {skipped}")
        elif kind == "step":
            self.step = int(event["step"])
            self.max_steps = int(event.get("max_steps") or self.max_steps)
            self.loss = float(event["loss"])
            self._rate.append((float(event["time"]), self.step))
            del self._rate[:-20]
            self._draw()
        elif kind == "checkpoint_complete":
            self.last_checkpoint = int(event["step"])
            if not self.tty:
                self.note(f"  checkpoint-{self.last_checkpoint} complete in {event.get('uri')}")
        elif kind == "end":
            self.load_hint = event.get("load")
        elif kind in ("upload_stalled", "upload_flowing"):
            self._on_upload_stall(event)
        elif kind == "preemption_notice":
            self.note(f"  preemption notice at step {event['step']}: taking an emergency checkpoint")
        elif kind == "emergency_checkpoint":
            without = event.get("going_on_without")
            then = f"; going on without ranks {without}" if without else ""
            step, seconds = event["step"], event["seconds"]
            self.note(f"  emergency checkpoint-{step} complete {seconds:.1f} s after the notice{then}")

    def _on_upload_stall(self, event: dict[str, Any]) -> None:
        """Uploads stalled on a store fault (its answer, since when), or flowing again."""
        if event["event"] == "upload_stalled":
            self.stalled_since = time.strftime("%H:%M:%S", time.localtime(float(event["since"])))
            self.note(
                f"  uploads stalled since {self.stalled_since}: the store answers {event.get('fault')} (retrying)"
            )
        elif self.stalled_since is not None:
            self.note(f"  uploads flow again (stalled since {self.stalled_since})")
            self.stalled_since = None

    def steps_per_second(self) -> float | None:
        if len(self._rate) < 2:
            return None
        (t0, s0), (t1, s1) = self._rate[0], self._rate[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def line(self) -> str:
        total = self.max_steps or 1
        filled = int(BAR_WIDTH * min(self.step, total) / total)
        rate = self.steps_per_second()
        eta = format_duration((total - self.step) / rate) if rate else "?"
        parts = [
            f"attempt {self.attempt}",
            f"step {self.step}/{self.max_steps} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]",
            f"loss {self.loss:.3f}" if self.loss is not None else "loss -",
            f"{rate:.2f} steps/s" if rate else "- steps/s",
            f"ETA {eta}",
            f"checkpoint {self.last_checkpoint}" if self.last_checkpoint is not None else "no checkpoint yet",
        ]
        if self.stalled_since is not None:
            parts.append(f"uploads stalled since {self.stalled_since}")
        return " | ".join(parts)

    def _draw(self) -> None:
        if self.tty:
            print("\r" + self.line(), end="", file=self.stream, flush=True)
            self._line_open = True
            return
        decile = int(10 * self.step / (self.max_steps or 1))
        if decile > self._last_decile:
            self._last_decile = decile
            print(self.line(), file=self.stream, flush=True)

    def _end_line(self) -> None:
        if self._line_open:
            print(file=self.stream)
            self._line_open = False

    def summary(self, tally: RunTally, final_uri: str, local_dir: Path) -> None:
        self.note("")
        self.note("done")
        loss = f", final loss {self.loss:.3f}" if self.loss is not None else ""
        self.note(f"  steps                {self.step}/{self.max_steps}{loss}")
        self.note(f"  attempts             {tally.attempts} ({tally.preemptions} preempted, {tally.failures} failed)")
        for what in tally.injected:
            self.note(f"  injected             {what}")
        if self.resumed_from:
            self.note(f"  resumed from         {', '.join(f'checkpoint-{step}' for step in self.resumed_from)}")
        self.note(f"  final checkpoint     {final_uri}")
        self.note(f"  downloaded to        {local_dir}")
        if self.load_hint:
            self.note(f"  load it with         {self.load_hint.replace('DIR', repr(str(local_dir)))}")
        self.note(f"  took                 {format_duration(time.monotonic() - self.started)}")
