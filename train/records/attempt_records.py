"""Reading and writing an attempt's records and the fence (the keys and identities: spotray/contract/attempts.py).

A reader ignores any record whose identity is not the attempt it asks about; the fence lets the
newest attempt's driver stop older attempts' uploads and prunes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from spotray.contract.attempts import FENCE_KEY, MAX_RECORD_BYTES, AttemptId, AttemptOutcome, AttemptRecords, Fence
from spotray.contract.errors import Cause, ObjectTooLargeError, SpotrayError
from spotray.train.storage.store import ObjectStore, get_bytes_if_exists

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


def write_outcome(store: ObjectStore, attempt: AttemptId, outcome: AttemptOutcome) -> None:
    fields = {"exit_code": outcome.exit_code, "step": outcome.step, "detail": outcome.detail}
    write_record(store, attempt.outcome_key, attempt, fields)


def read_attempt_records(store: ObjectStore, attempt: AttemptId) -> AttemptRecords:
    return AttemptRecords(
        outcome=read_record(store, attempt.outcome_key, attempt),
        preempted=read_record(store, attempt.preemption_key, attempt),
    )


def write_preemption(store: ObjectStore, attempt: AttemptId, step: int, seconds_after_notice: float) -> None:
    fields = {"step": step, "seconds_after_notice": round(seconds_after_notice, 3)}
    write_record(store, attempt.preemption_key, attempt, fields)


# ------------------------------------------------------------------------------------------ fencing


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
    """A newer attempt has claimed the checkpoint URI; this one must not write there any more.

    Its cause (spotray/contract/errors.py) depends on who holds the fence: a newer attempt of the
    same run is the normal course of things (infrastructure: this attempt just stops, spending
    nothing); another run's attempt means two runs write to one checkpoint URI, which they would
    take from each other for ever (bad input: give each run its own).
    """

    def __init__(self, attempt: AttemptId, fence: Fence) -> None:
        self.attempt, self.fence = attempt, fence
        holder = f"attempt {fence.attempt} of run {fence.run_id} now owns the checkpoint URI"
        if fence.run_id == attempt.run_id:
            self.cause = Cause.INFRASTRUCTURE
            fix = "nothing to do: this attempt stops writing; the newer one goes on from its own checkpoints"
        else:
            self.cause = Cause.BAD_INPUT
            fix = "two runs write to the same checkpoint URI: give each run its own spec.checkpoint.uri"
        super().__init__(f"{attempt} is superseded: {holder}", fix)

    def __reduce__(self) -> tuple[type[SupersededError], tuple[AttemptId, Fence]]:  # type: ignore[override]
        # Rebuilt from the attempt and the fence when it comes back from the upload process.
        return (type(self), (self.attempt, self.fence))


def check_fence(store: ObjectStore, attempt: AttemptId) -> Fence | None:
    """Raise ``SupersededError`` if another attempt holds the fence; return the fence (None: none yet)."""
    fence = read_fence(store)
    if fence is not None and not fence.holds(attempt):
        raise SupersededError(attempt, fence)
    return fence
