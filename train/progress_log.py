"""Training progress kept next to the checkpoints, so anyone with the checkpoint URI can follow a run.

Rank 0 of each attempt rewrites one small object, ``_spotray/attempt-<N>.progress.json``::

    {"attempt": 2, "resumed_from": 30, "max_steps": 100, "world_size": 2, "updated": 1763870000.0,
     "points": [[31, 3.21, 1763869990.5], [32, 3.19, 1763869990.6], ...]}   # [step, loss, unix time]

at most every ``interval_s`` seconds and once more when training ends. Objects, not appends,
because S3 cannot append; one per attempt, so a new attempt never rewrites an old one's history.
The controller reads the newest attempt's last point for ``status.progress``; ``spotray plot``
joins every attempt's points and marks where each resumed. Writing is best effort: progress that
cannot be written is logged and training goes on.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from spotray.train.checkpoint import RUN_STATE_PREFIX
from spotray.train.store import ObjectStore, get_bytes_if_exists

log = logging.getLogger(__name__)

_PROGRESS_KEY_PATTERN = re.compile(rf"^{RUN_STATE_PREFIX}/attempt-(\d+)\.progress\.json$")
DEFAULT_INTERVAL_S = 5.0


def attempt_progress_key(attempt: int) -> str:
    return f"{RUN_STATE_PREFIX}/attempt-{attempt}.progress.json"


@dataclass
class AttemptProgress:
    """What one attempt trained: every logged (step, loss, time), where it started, its target."""

    attempt: int
    resumed_from: int | None = None
    max_steps: int | None = None
    world_size: int | None = None
    updated: float = 0.0
    points: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def last_step(self) -> int | None:
        return self.points[-1][0] if self.points else None

    @property
    def last_loss(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def steps_per_second(self, window: int = 20) -> float | None:
        """Recent speed from the last ``window`` points; None until there are two."""
        recent = self.points[-window:]
        if len(recent) < 2 or recent[-1][2] <= recent[0][2]:
            return None
        return (recent[-1][0] - recent[0][0]) / (recent[-1][2] - recent[0][2])

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "attempt": self.attempt,
                "resumed_from": self.resumed_from,
                "max_steps": self.max_steps,
                "world_size": self.world_size,
                "updated": self.updated,
                "points": [list(point) for point in self.points],
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> AttemptProgress:
        raw: dict[str, Any] = json.loads(data)
        return cls(
            attempt=int(raw["attempt"]),
            resumed_from=raw.get("resumed_from"),
            max_steps=raw.get("max_steps"),
            world_size=raw.get("world_size"),
            updated=float(raw.get("updated", 0.0)),
            points=[(int(step), float(loss), float(when)) for step, loss, when in raw.get("points", [])],
        )


class ProgressWriter:
    """Collects (step, loss) on rank 0 and rewrites the attempt's progress object now and then."""

    def __init__(self, store: ObjectStore, progress: AttemptProgress, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.store = store
        self.progress = progress
        self.interval_s = interval_s
        self._last_write = 0.0

    def record(self, step: int, loss: float) -> None:
        now = time.time()
        self.progress.points.append((step, loss, now))
        if now - self._last_write >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        self.progress.updated = time.time()
        self._last_write = self.progress.updated
        try:
            self.store.put_bytes(attempt_progress_key(self.progress.attempt), self.progress.to_json())
        except Exception as error:  # noqa: BLE001 - progress is best effort; training must go on
            log.warning("could not write training progress to the store: %s", error)


# A point is about 40 bytes and one is kept per logged step, so a long run's object can pass the
# 1 MiB bound of other records; this bound still keeps a hostile object out of memory.
MAX_PROGRESS_BYTES = 64 << 20


def read_attempt_progress(store: ObjectStore, attempt: int) -> AttemptProgress | None:
    """One attempt's progress; None if it wrote none (yet) or the object is unreadable."""
    raw = get_bytes_if_exists(store, attempt_progress_key(attempt), max_bytes=MAX_PROGRESS_BYTES)
    if raw is None:
        return None
    try:
        return AttemptProgress.from_json(raw)
    except (ValueError, KeyError, TypeError) as error:
        log.warning("ignoring unreadable progress of attempt %d: %s", attempt, error)
        return None


def read_run_progress(store: ObjectStore) -> list[AttemptProgress]:
    """Every attempt's progress under the run's checkpoint URI, oldest attempt first."""
    attempts = sorted(
        int(match.group(1))
        for info in store.list(f"{RUN_STATE_PREFIX}/")
        if (match := _PROGRESS_KEY_PATTERN.match(info.key))
    )
    found = (read_attempt_progress(store, attempt) for attempt in attempts)
    return [progress for progress in found if progress is not None]
