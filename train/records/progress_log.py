"""Training progress kept next to the checkpoints, so anyone with the checkpoint URI can follow a run.

Rank 0 of each attempt rewrites one small object, ``_spotray/<run id>/attempt-<N>.progress.json``
(spotray/contract/attempts.py)::

    {"run_id": "...", "attempt": 2, "resumed_from": 30, "max_steps": 100, "world_size": 2,
     "started": 1763869980.0, "updated": 1763870000.0,
     "points": [[31, 3.21, 1763869990.5], ...],          # [step, loss, unix time]
     "restarts": [[40, 1763870100.0]],                  # workers restarted inside the attempt: [from step, time]
     "checkpoint_stalls": [[40, 0.8, 1763870090.0]],    # [step, seconds the loop waited for the save, time]
     "checkpoint_interval": {...},                      # everySteps: auto's latest choice
     "worker_hosts": {"idle": ["w-2"], "busy": ["w-1"], "time": 1763870000.0},  # runs with spares: Ray's view
     "upload_stall": {"since": 1763870050.0, "fault": "503 SlowDown"}}  # while uploads retry a store fault

Objects, not appends, because S3 cannot append; one per attempt, so a new attempt never rewrites
an old one's history. A worker group that Ray Train restarts inside the attempt continues its
attempt's object (``continue_attempt_progress``) and marks where it resumed in ``restarts``.
The controller reads the newest attempt's last point for ``status.progress``;
``spotray plot`` joins every attempt's points and marks where each resumed.

The training thread never waits for S3: ``ProgressWriter.record`` appends to memory, and a
background thread writes the newest snapshot at most every ``interval_s`` seconds (writes coalesce:
an S3 outage delays progress, never a step). The object is bounded: past ``MAX_POINTS`` points,
every other point of the older half is dropped, so a long run keeps its whole curve, thinned; the
checkpoint stalls and the restarts likewise. So it stays under the bounds every reader keeps
(``MAX_PROGRESS_BYTES``, ``MAX_PROGRESS_VALUES``; spotray/contract/bounded_json.py): the controller
reads a run's progress from a bucket the run's owner can write, and one hostile object must not
take its memory. Writing is best effort: progress that cannot be written is logged and training goes on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from spotray.contract.attempts import RECORDS_PREFIX, RUN_ID_PATTERN, AttemptId
from spotray.contract.bounded_json import count, load_json, number, optional, seconds, unix_time
from spotray.contract.checkpoint_key import CheckpointKey
from spotray.train.storage.store import ObjectStore, get_bytes_if_exists

log = logging.getLogger(__name__)

_PROGRESS_KEY_PATTERN = re.compile(
    rf"^{RECORDS_PREFIX}/({RUN_ID_PATTERN.pattern[1:-1]})/attempt-(\d+)\.progress\.json$"
)
DEFAULT_INTERVAL_S = 5.0
# Points and checkpoint stalls kept each (``AttemptProgress.thin``): a long run's whole curve, thinned.
MAX_POINTS = 10_000
# Worker groups restarted inside one attempt that are kept apart in the ledger: a restart past them
# joins its lifetime to the one before (its restart's lost time then counts as a step's).
MAX_RESTARTS = 1_000
# Worker pods named in ``worker_hosts`` (a run with more is cut to these; a pod name is <= 253 bytes).
MAX_WORKER_HOSTS = 256
# Newer complete checkpoints the attempt did not resume from, each "checkpoint-<step>: why": a few say it.
MAX_SKIPPED_CHECKPOINTS = 5
MAX_SKIPPED_CHARS = 400
# The bounds of the object, which the writer keeps by the three above: at most 10,000 points and
# 10,000 stalls of about 70 and 55 bytes with the longest numbers (a 19-digit step, a 24-character
# loss), and 1,000 restarts: 1.3 MB and 83,000 values (tests/unit/test_progress_log.py). A read of
# an object at these bounds stays within the 16 MiB budget of tests/unit/test_read_memory.py; the
# bound of 64 MiB they replaced let one hostile object take 2 GiB of the controller's 512 MiB.
MAX_PROGRESS_BYTES = 1536 << 10
MAX_PROGRESS_VALUES = 100_000
# The store's answer an upload stall names, as kept (a fault's text is the store's, of any length).
MAX_STALL_FAULT_CHARS = 300
# What a progress object's HMAC is for (spotray/contract/checkpoint_key.py).
PROGRESS_PURPOSE = "attempt progress"


@dataclass(frozen=True)
class WorkerHosts:
    """A run with spares: which worker pods run no training worker (idle) and which do (busy), as Ray
    saw them at ``time`` (unix seconds). Rank 0 reads it (train/launch/ray_capacity.py) and writes it
    in its attempt's progress; the controller moves an idle spare that shares a node with a busy
    worker (controller/spare_placement.py). A Ray node's hostname is its pod's name."""

    idle: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    time: float = 0.0

    def to_json(self) -> dict[str, Any]:
        cut = MAX_WORKER_HOSTS
        return {"idle": list(self.idle[:cut]), "busy": list(self.busy[:cut]), "time": self.time}

    @classmethod
    def from_json(cls, raw: object) -> WorkerHosts | None:
        """As written; None when missing or not that shape (it is only advice: the rest of the progress stands)."""
        if not isinstance(raw, dict):
            return None
        idle, busy, at = raw.get("idle"), raw.get("busy"), raw.get("time")
        if not _names(idle) or not _names(busy):
            return None
        try:
            at = unix_time(at, "worker_hosts.time")
        except ValueError:
            return None
        return cls(tuple(idle[:MAX_WORKER_HOSTS]), tuple(busy[:MAX_WORKER_HOSTS]), float(at))


@dataclass(frozen=True)
class UploadStallNote:
    """Checkpoint uploads have been retrying a store fault since ``since`` (unix seconds): the store's
    answer, e.g. "503 SlowDown". Rank 0 writes it while it lasts; the controller shows it in
    status.progress, so `spotray status` says why checkpoints stopped (train/hf/progress.py)."""

    since: float
    fault: str

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "fault": self.fault[:MAX_STALL_FAULT_CHARS]}

    @classmethod
    def from_json(cls, raw: object) -> UploadStallNote | None:
        """As written, the fault cut to its bound; None when missing or not that shape (the rest stands)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("fault"), str):
            return None
        try:
            since = unix_time(raw.get("since"), "upload_stall.since")
        except ValueError:
            return None
        return cls(float(since), raw["fault"][:MAX_STALL_FAULT_CHARS])


def _ranks(value: object, what: str) -> int:
    return count(value, what, minimum=1)


def _names(raw: object) -> TypeGuard[list[str]]:
    return isinstance(raw, list) and all(isinstance(name, str) for name in raw)


@dataclass
class AttemptProgress:
    """What one attempt trained: every logged (step, loss, time), where it started, its target."""

    attempt: int
    run_id: str
    resumed_from: int | None = None
    max_steps: int | None = None
    world_size: int | None = None
    updated: float = 0.0
    points: list[tuple[int, float, float]] = field(default_factory=list)
    started: float | None = None  # when the (first) worker group began training: its nodes were there
    restarts: list[tuple[int, float]] = field(default_factory=list)  # (resumed from step, time)
    checkpoint_stalls: list[tuple[int, float, float]] = field(default_factory=list)  # (step, seconds, time)
    checkpoint_interval: dict[str, Any] | None = None
    worker_hosts: WorkerHosts | None = None  # a run with spares: Ray's view of its worker pods
    # Complete checkpoints newer than the one it resumed from that it passed over, and why (corrupt,
    # unloadable): "checkpoint-40: ...". The status says them (issue #69).
    skipped_checkpoints: list[str] = field(default_factory=list)
    upload_stall: UploadStallNote | None = None  # uploads retrying a store fault, while it lasts
    # On several nodes: where the current worker group's resume read the checkpoint (bytes: nodes,
    # s3_bytes, peer_bytes, kept_bytes; train/checkpoints/resume.py SharedReadCount).
    resume_read: dict[str, int] | None = None

    @property
    def current_worker_hosts(self) -> WorkerHosts | None:
        """``worker_hosts`` if the current worker group wrote it: not one from before the group's last restart,
        which may call idle the very spare the new group started on (the controller would delete it)."""
        hosts = self.worker_hosts
        if hosts is None or any(at >= hosts.time for _, at in self.restarts):
            return None
        return hosts

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

    def to_json(self, key: CheckpointKey | None = None) -> bytes:
        """The object as stored: signed with ``key`` when there is one (the controller acts on ``worker_hosts``)."""
        content = {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "resumed_from": self.resumed_from,
            "max_steps": self.max_steps,
            "world_size": self.world_size,
            "started": self.started,
            "updated": self.updated,
            "points": [list(point) for point in self.points],
            "restarts": [list(restart) for restart in self.restarts],
            "checkpoint_stalls": [list(stall) for stall in self.checkpoint_stalls],
            "checkpoint_interval": self.checkpoint_interval,
            "worker_hosts": self.worker_hosts.to_json() if self.worker_hosts is not None else None,
            "skipped_checkpoints": [
                text[:MAX_SKIPPED_CHARS] for text in self.skipped_checkpoints[:MAX_SKIPPED_CHECKPOINTS]
            ],
            "upload_stall": self.upload_stall.to_json() if self.upload_stall is not None else None,
            "resume_read": self.resume_read,
        }
        return json.dumps(key.sign(PROGRESS_PURPOSE, content) if key is not None else content).encode()

    @classmethod
    def from_json(cls, data: bytes, key: CheckpointKey | None = None) -> AttemptProgress:
        """The object's content; ValueError when it is past its bounds, is not JSON, holds a value out of
        range (a time past year 9999, a negative step: spotray/contract/bounded_json.py; a loss may be NaN),
        or, with ``key``, is not signed with it."""
        raw: dict[str, Any] = load_json(data, max_bytes=MAX_PROGRESS_BYTES, max_values=MAX_PROGRESS_VALUES)
        if key is not None and (problem := key.problem(PROGRESS_PURPOSE, raw)) is not None:
            raise ValueError(f"it {problem}")
        return cls(
            attempt=count(raw["attempt"], "attempt", minimum=1),
            run_id=str(raw["run_id"]),
            resumed_from=optional(count, raw.get("resumed_from"), "resumed_from"),
            max_steps=optional(count, raw.get("max_steps"), "max_steps"),
            world_size=optional(_ranks, raw.get("world_size"), "world_size"),
            started=optional(unix_time, raw.get("started"), "started"),
            updated=unix_time(raw.get("updated", 0.0), "updated"),
            points=[
                (count(step, "a point's step"), number(loss, "a point's loss"), unix_time(at, "a point's time"))
                for step, loss, at in raw.get("points", [])
            ],
            restarts=[
                (count(step, "a restart's step"), unix_time(at, "a restart's time"))
                for step, at in raw.get("restarts") or []
            ],
            checkpoint_stalls=[
                (count(step, "a stall's step"), seconds(waited, "a stall's seconds"), unix_time(at, "a stall's time"))
                for step, waited, at in raw.get("checkpoint_stalls") or []
            ],
            checkpoint_interval=raw.get("checkpoint_interval"),
            worker_hosts=WorkerHosts.from_json(raw.get("worker_hosts")),
            skipped_checkpoints=_skipped_checkpoints(raw.get("skipped_checkpoints")),
            upload_stall=UploadStallNote.from_json(raw.get("upload_stall")),
            resume_read=_resume_read(raw.get("resume_read")),
        )

    @property
    def attempt_id(self) -> AttemptId:
        return AttemptId(self.run_id, self.attempt)

    def thin(self, max_points: int = MAX_POINTS, max_restarts: int = MAX_RESTARTS) -> None:
        """Past ``max_points``, drop every other point of the older half (the newest stay dense).

        Checkpoint stalls are thinned the same way (a run with a checkpoint every few steps has many);
        each kept one then stands for the one dropped beside it, so their sum stays about right.
        Restarts past ``max_restarts`` too: a dropped one's lifetime joins the one before it.
        """
        if len(self.points) > max_points:
            half = len(self.points) // 2
            self.points = self.points[:half:2] + self.points[half:]
        if len(self.restarts) > max_restarts:
            half = len(self.restarts) // 2
            self.restarts = self.restarts[:half:2] + self.restarts[half:]
        if len(self.checkpoint_stalls) > max_points:
            half = len(self.checkpoint_stalls) // 2
            older = self.checkpoint_stalls[: half - half % 2]
            pairs = [(a[0], a[1] + b[1], a[2]) for a, b in zip(older[::2], older[1::2], strict=True)]
            self.checkpoint_stalls = pairs + self.checkpoint_stalls[len(older) :]


class ProgressWriter:
    """Collects (step, loss) on rank 0; a background thread writes the attempt's progress object."""

    def __init__(self, store: ObjectStore, progress: AttemptProgress, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.store = store
        self.progress = progress
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._dirty = threading.Event()  # points not written yet
        self._hurry = threading.Event()  # a flush: do not wait out the interval
        self._written = threading.Condition(self._lock)
        # Snapshots taken; a flush waits for the one it asked for. The first is the attempt as it
        # begins (its resume point, its target): an attempt that resumed at the last step logs no
        # step, and without it the run's status kept the previous attempt's last report.
        self._generation = 1
        self._writes_done = 0
        self._closed = False
        self._dirty.set()
        self._thread = threading.Thread(target=self._run, name="spotray-progress", daemon=True)
        self._thread.start()

    def record(self, step: int, loss: float) -> None:
        """Append a point; returns at once (the write happens on the writer's thread)."""
        self._change(lambda progress: progress.points.append((step, loss, time.time())))

    def record_checkpoint_stall(self, step: int, seconds: float) -> None:
        """The training loop waited ``seconds`` for the checkpoint of ``step`` (the goodput ledger's cost)."""
        self._change(lambda progress: progress.checkpoint_stalls.append((step, round(seconds, 4), time.time())))

    def record_worker_hosts(self, hosts: WorkerHosts) -> None:
        """Which worker pods run no training worker and which do, as Ray saw them (a run with spares)."""
        self._change(lambda progress: setattr(progress, "worker_hosts", hosts))

    def record_checkpoint_interval(self, decision: dict[str, Any]) -> None:
        """everySteps: auto's newest choice and the numbers it came from (the controller shows it in status)."""
        self._change(lambda progress: setattr(progress, "checkpoint_interval", decision))

    def record_upload_stall(self, stall: UploadStallNote | None) -> None:
        """Uploads stalled on a store fault (since when, the store's answer), or flow again (None)."""
        self._change(lambda progress: setattr(progress, "upload_stall", stall))

    def _change(self, change: Callable[[AttemptProgress], None]) -> None:
        with self._lock:
            change(self.progress)
            self.progress.thin()
            self._generation += 1
        self._dirty.set()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Write what was recorded and wait up to ``timeout_s`` for it; False if it did not land in time."""
        with self._lock:
            wanted = self._generation
        self._hurry.set()
        self._dirty.set()
        with self._written:
            return self._written.wait_for(lambda: self._writes_done >= wanted, timeout=timeout_s)

    def close(self, timeout_s: float = 30.0) -> bool:
        written = self.flush(timeout_s)
        self._closed = True
        self._hurry.set()
        self._dirty.set()
        return written

    def _run(self) -> None:
        while not self._closed:
            self._dirty.wait()
            if self._closed:
                return
            self._dirty.clear()
            with self._lock:
                generation = self._generation
                self.progress.updated = time.time()
                snapshot = self.progress.to_json(self.store.checkpoint_key)
            try:
                self.store.put_bytes(self.progress.attempt_id.progress_key, snapshot)
            except Exception as error:  # noqa: BLE001 - progress is best effort; training must go on
                log.warning("could not write training progress to the store: %s", error)
            with self._written:
                self._writes_done = max(self._writes_done, generation)
                self._written.notify_all()
            # Coalesce: the next write carries every point recorded meanwhile; a flush cuts the pause short.
            if self._hurry.wait(self.interval_s):
                self._hurry.clear()


def read_attempt_progress(store: ObjectStore, attempt: AttemptId) -> AttemptProgress | None:
    """One attempt's progress; None if it wrote none (yet), or the object is unreadable or not this attempt's."""
    raw = get_bytes_if_exists(store, attempt.progress_key, max_bytes=MAX_PROGRESS_BYTES)
    return None if raw is None else parse_attempt_progress(raw, attempt, store.checkpoint_key)


RESUME_READ_KEYS = ("nodes", "s3_bytes", "peer_bytes", "kept_bytes", "completed_bytes")


def _resume_read(raw: object) -> dict[str, int] | None:
    """The object's ``resume_read``: counts under its known keys; ValueError for anything else."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not set(raw) <= set(RESUME_READ_KEYS):
        raise ValueError(f"resume_read is not an object of {', '.join(RESUME_READ_KEYS)}")
    return {key: count(value, f"resume_read's {key}") for key, value in raw.items()}


def _skipped_checkpoints(raw: object) -> list[str]:
    """The object's ``skipped_checkpoints``, within bounds; ValueError when it is not a list of strings."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(text, str) for text in raw):
        raise ValueError("skipped_checkpoints is not a list of strings")
    return [text[:MAX_SKIPPED_CHARS] for text in raw[:MAX_SKIPPED_CHECKPOINTS]]


def continue_attempt_progress(store: ObjectStore, fresh: AttemptProgress) -> AttemptProgress:
    """``fresh``, or this attempt's object so far when an earlier worker group of the attempt wrote one.

    Ray Train restarts the worker group inside an attempt after a worker is lost; the new group's
    rank 0 continues the attempt's object, so what the earlier group trained stays in the curve and
    the ledger, and records where it resumed.
    """
    try:
        earlier = read_attempt_progress(store, fresh.attempt_id)
    except Exception as error:  # noqa: BLE001 - progress is best effort; an unreadable store must not stop training
        log.warning("could not read this attempt's earlier progress: %s", error)
        earlier = None
    if earlier is None or not (earlier.points or earlier.restarts):
        return fresh
    earlier.restarts.append((fresh.resumed_from or 0, time.time()))
    earlier.world_size = fresh.world_size
    earlier.worker_hosts = None  # the earlier group's view: the new group writes its own
    earlier.skipped_checkpoints = list(dict.fromkeys(fresh.skipped_checkpoints + earlier.skipped_checkpoints))
    earlier.resume_read = fresh.resume_read  # the new group's resume
    earlier.thin()
    return earlier


def parse_attempt_progress(raw: bytes, attempt: AttemptId, key: CheckpointKey | None) -> AttemptProgress | None:
    """The progress object's content; None if it is unreadable, not this attempt's, or (with ``key``) not signed
    with the run's key."""
    try:
        progress = AttemptProgress.from_json(raw, key)
    except (ValueError, KeyError, TypeError, OverflowError) as error:
        log.warning("ignoring unreadable progress of %s: %s", attempt, error)
        return None
    return progress if progress.attempt_id == attempt else None


def read_run_progress(store: ObjectStore, run_id: str | None = None) -> list[AttemptProgress]:
    """Every attempt's progress of one run, oldest attempt first.

    ``run_id`` None: the run that wrote progress last (a checkpoint URI may hold an older run's too).
    """
    found: dict[str, list[int]] = {}
    for info in store.list(f"{RECORDS_PREFIX}/"):
        match = _PROGRESS_KEY_PATTERN.match(info.key)
        if match:
            found.setdefault(match.group(1), []).append(int(match.group(2)))
    runs = {
        run: [p for p in (read_attempt_progress(store, AttemptId(run, n)) for n in sorted(numbers)) if p is not None]
        for run, numbers in found.items()
        if run_id is None or run == run_id
    }
    runs = {run: history for run, history in runs.items() if history}
    if not runs:
        return []
    newest = max(runs, key=lambda run: max(p.updated for p in runs[run]))
    return runs[newest]
