"""The attempt contract: what the job, the controller and local mode agree on about one attempt.

Identity. A run has an id: the TrainingRun's UID under the controller, an id kept in the work
directory in local mode, a fresh one for a job started by hand. The controller and local mode pass
it to the job in ``SPOTRAY_RUN`` (train/runspec.py ``RunContext``) with the attempt's number. Every
record an attempt writes lives under its run's id and names the attempt inside, and a reader
ignores a record whose identity is not the one it asked for: a run re-created with the same
checkpoint URI, or a finished local run started again, never reads another run's records.

Layout under the run's checkpoint URI (checkpoints themselves: train/checkpoint.py)::

    _spotray/<run id>/attempt-<N>.json            how attempt N ended (the driver, train/launcher.py)
    _spotray/<run id>/attempt-<N>.preempted.json  rank 0 stopped on a preemption notice, its
                                                  emergency checkpoint complete (train/worker.py)
    _spotray/<run id>/attempt-<N>.progress.json   training progress (rank 0, train/progress_log.py)
    _spotray/fence.json                           the newest attempt to start; older ones stop writing

Exit codes of the job's driver and outcomes of an attempt are defined here too, once.
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

from spotray.train.errors import ObjectTooLargeError, SpotrayError
from spotray.train.store import ObjectStore, get_bytes_if_exists

RECORDS_PREFIX = "_spotray"
FENCE_KEY = f"{RECORDS_PREFIX}/fence.json"
# Records are a few hundred bytes; a bound keeps a hostile object out of memory.
MAX_RECORD_BYTES = 1 << 20

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PREEMPTED = 128 + signal.SIGTERM  # 143: stopped on a notice after a complete emergency checkpoint

# How an attempt ended: status.attempts[].outcome.
OUTCOME_RUNNING, OUTCOME_SUCCEEDED, OUTCOME_PREEMPTED, OUTCOME_FAILED, OUTCOME_SUSPENDED = (
    "Running",
    "Succeeded",
    "Preempted",
    "Failed",
    "Suspended",
)
OUTCOMES = (OUTCOME_RUNNING, OUTCOME_SUCCEEDED, OUTCOME_PREEMPTED, OUTCOME_FAILED, OUTCOME_SUSPENDED)

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def check_run_id(run_id: str) -> str:
    """A run id becomes an S3 key segment: plain characters only, at most 64."""
    if not RUN_ID_PATTERN.match(run_id):
        raise SpotrayError(
            f"run id {run_id!r} is not a plain name (letters, digits, '.', '_', '-'; at most 64)",
            "let the controller or `spotray run` set SPOTRAY_RUN; do not write it by hand",
        )
    return run_id


@dataclass(frozen=True)
class AttemptId:
    """Which attempt of which run: the identity every record carries."""

    run_id: str
    attempt: int

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.attempt < 1:
            raise ValueError(f"attempt numbers count from 1, got {self.attempt}")

    def _key(self, suffix: str) -> str:
        return f"{RECORDS_PREFIX}/{self.run_id}/attempt-{self.attempt}{suffix}"

    @property
    def outcome_key(self) -> str:
        return self._key(".json")

    @property
    def preemption_key(self) -> str:
        return self._key(".preempted.json")

    @property
    def progress_key(self) -> str:
        return self._key(".progress.json")

    def identity(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "attempt": self.attempt}

    def __str__(self) -> str:
        return f"attempt {self.attempt} of run {self.run_id}"


# ------------------------------------------------------------------------------------------ records


def write_record(store: ObjectStore, key: str, attempt: AttemptId, fields: dict[str, Any]) -> None:
    """Write one record: ``fields`` plus the attempt's identity and the time."""
    record = {**fields, **attempt.identity(), "time": time.time()}
    store.put_bytes(key, json.dumps(record, sort_keys=True).encode())


def read_record(store: ObjectStore, key: str, attempt: AttemptId) -> dict[str, Any] | None:
    """The record at ``key`` if it exists, parses, and belongs to ``attempt``; else None.

    A record of another run or attempt (an older run's, copied or left behind) is ignored, never
    believed; a malformed one too. Store faults (unreachable, denied) raise: "cannot read" is not
    "not there", and callers decide what that means.
    """
    try:
        raw = get_bytes_if_exists(store, key, max_bytes=MAX_RECORD_BYTES)
    except ObjectTooLargeError:
        return None
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if record.get("run_id") != attempt.run_id or record.get("attempt") != attempt.attempt:
        return None
    return record


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended, as its driver saw it: the exit code and what a person should read."""

    exit_code: int
    step: int | None
    detail: str


def write_outcome(store: ObjectStore, attempt: AttemptId, outcome: AttemptOutcome) -> None:
    fields = {"exit_code": outcome.exit_code, "step": outcome.step, "detail": outcome.detail}
    write_record(store, attempt.outcome_key, attempt, fields)


@dataclass(frozen=True)
class AttemptRecords:
    """What the job wrote about one attempt (each None when absent or not this attempt's)."""

    outcome: dict[str, Any] | None = None
    preempted: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int | None:
        code = (self.outcome or {}).get("exit_code")
        return code if isinstance(code, int) else None


def read_attempt_records(store: ObjectStore, attempt: AttemptId) -> AttemptRecords:
    return AttemptRecords(
        outcome=read_record(store, attempt.outcome_key, attempt),
        preempted=read_record(store, attempt.preemption_key, attempt),
    )


def write_preemption(store: ObjectStore, attempt: AttemptId, step: int, seconds_after_notice: float) -> None:
    fields = {"step": step, "seconds_after_notice": round(seconds_after_notice, 3)}
    write_record(store, attempt.preemption_key, attempt, fields)


# ------------------------------------------------------------------------------------------ fencing


@dataclass(frozen=True)
class Fence:
    """The newest attempt to start on this checkpoint URI, and the step it resumed from."""

    run_id: str
    attempt: int
    resumed_from: int | None = None

    def holds(self, attempt: AttemptId) -> bool:
        return (self.run_id, self.attempt) == (attempt.run_id, attempt.attempt)


def write_fence(store: ObjectStore, attempt: AttemptId, resumed_from: int | None = None) -> None:
    """Claim the checkpoint URI for ``attempt``: older attempts see it and stop uploading and pruning."""
    write_record(store, FENCE_KEY, attempt, {"resumed_from": resumed_from})


def read_fence(store: ObjectStore) -> Fence | None:
    """The fence, or None when no attempt has claimed the URI (or the object is not one we wrote)."""
    raw = get_bytes_if_exists(store, FENCE_KEY, max_bytes=MAX_RECORD_BYTES)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        resumed = record.get("resumed_from")
        return Fence(str(record["run_id"]), int(record["attempt"]), int(resumed) if resumed is not None else None)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class SupersededError(SpotrayError):
    """A newer attempt has claimed the checkpoint URI; this one must not write there any more."""

    def __init__(self, attempt: AttemptId, fence: Fence) -> None:
        super().__init__(
            f"{attempt} is superseded: attempt {fence.attempt} of run {fence.run_id} now owns the checkpoint URI",
            "nothing to do: this attempt stops writing; the newer one goes on from its own checkpoints",
        )


def check_fence(store: ObjectStore, attempt: AttemptId) -> Fence | None:
    """Raise ``SupersededError`` if another attempt holds the fence; return the fence (None: none yet)."""
    fence = read_fence(store)
    if fence is not None and not fence.holds(attempt):
        raise SupersededError(attempt, fence)
    return fence
