"""Reading and writing an attempt's records and the fence (the keys and identities: spotray/contract/attempts.py).

A reader ignores any record whose identity is not the attempt it asks about; the fence lets the
newest attempt's driver stop older attempts' uploads and prunes. Where the store has the run's
checkpoint key (spotray/contract/checkpoint_key.py), every record is signed with it, and a reader
holding the key takes an unsigned or forged one for unreadable, never for a fact: the controller
acts on them (an outcome with exit code 0 ends a run Succeeded), and a writer of the bucket without
the key could otherwise write one.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from spotray.contract.attempts import (
    FENCE_KEY,
    MAX_DETAIL_CHARS,
    MAX_RECORD_BYTES,
    MAX_RECORD_VALUES,
    AttemptId,
    AttemptOutcome,
    AttemptRecords,
    Fence,
)
from spotray.contract.bounded_json import count, load_json, optional
from spotray.contract.errors import Cause, ObjectTooLargeError, SpotrayError
from spotray.train.storage.store import ObjectStore, get_bytes_if_exists

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------ records


# What a record's HMAC is for (spotray/contract/checkpoint_key.py): never valid as a manifest's.
RECORD_PURPOSE = "attempt record"


def write_record(store: ObjectStore, key: str, attempt: AttemptId, fields: dict[str, Any]) -> None:
    """Write one record: ``fields`` plus the attempt's identity and the time, signed with the store's key if any."""
    record = {**fields, **attempt.identity(), "time": time.time()}
    if store.checkpoint_key is not None:
        record = store.checkpoint_key.sign(RECORD_PURPOSE, record)
    store.put_bytes(key, json.dumps(record, sort_keys=True).encode())


def _unsigned(store: ObjectStore, key: str, record: dict[str, Any]) -> bool:
    """Whether the store has a key and ``record`` was not signed with it (logged: someone else wrote it)."""
    problem = store.checkpoint_key.problem(RECORD_PURPOSE, record) if store.checkpoint_key is not None else None
    if problem is not None:
        log.warning("ignoring %s: it %s", store.uri.join(key), problem)
    return problem is not None


def read_record(store: ObjectStore, key: str, attempt: AttemptId) -> dict[str, Any] | None:
    """The record at ``key`` if it exists, parses, and belongs to ``attempt``; else None.

    A record of another run or attempt (an older run's, copied or left behind) is ignored, never
    believed; a malformed one too. Store faults (unreachable, denied) raise: "cannot read" is not
    "not there", and callers decide what that means.
    """
    record = read_run_record(store, key, attempt.run_id)
    return record if record is not None and record.get("attempt") == attempt.attempt else None


def read_run_record(store: ObjectStore, key: str, run_id: str) -> dict[str, Any] | None:
    """The record at ``key`` if it exists, parses, and belongs to the run ``run_id`` (any of its attempts)."""
    try:
        raw = get_bytes_if_exists(store, key, max_bytes=MAX_RECORD_BYTES)
    except ObjectTooLargeError:
        return None
    if raw is None:
        return None
    try:
        record = load_json(raw, max_bytes=MAX_RECORD_BYTES, max_values=MAX_RECORD_VALUES)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("run_id") != run_id or _unsigned(store, key, record):
        return None
    return record


def write_outcome(store: ObjectStore, attempt: AttemptId, outcome: AttemptOutcome) -> None:
    """The detail is cut to ``MAX_DETAIL_CHARS`` (an error's text can be any length): even at twelve
    bytes a character (escaped past the Basic Multilingual Plane) the record stays under ``MAX_RECORD_BYTES``."""
    detail = outcome.detail if len(outcome.detail) <= MAX_DETAIL_CHARS else outcome.detail[:MAX_DETAIL_CHARS] + " [cut]"
    fields = {"exit_code": outcome.exit_code, "step": outcome.step, "detail": detail}
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


@dataclass(frozen=True)
class _FenceRecord:
    """The fence as written: who holds it and, when it was taken over from another run (``check_fence``),
    from which run, and whether that was taking back a claim the other run had taken over."""

    fence: Fence
    taken_from: str | None = None
    taken_back: bool = False


def write_fence(store: ObjectStore, attempt: AttemptId, resumed_from: int | None = None) -> None:
    """Claim the checkpoint URI for ``attempt``: older attempts see it and stop uploading and pruning."""
    write_record(store, FENCE_KEY, attempt, {"resumed_from": resumed_from})


def _take_over_fence(store: ObjectStore, attempt: AttemptId, taken_from: str, taken_back: bool) -> None:
    write_record(store, FENCE_KEY, attempt, {"resumed_from": None, "taken_from": taken_from, "taken_back": taken_back})


def _read_fence_record(store: ObjectStore) -> _FenceRecord | None:
    raw = get_bytes_if_exists(store, FENCE_KEY, max_bytes=MAX_RECORD_BYTES)
    if raw is None:
        return None
    try:
        record = load_json(raw, max_bytes=MAX_RECORD_BYTES, max_values=MAX_RECORD_VALUES)
        if _unsigned(store, FENCE_KEY, record):
            return None
        resumed, taken_from = record.get("resumed_from"), record.get("taken_from")
        return _FenceRecord(
            Fence(
                str(record["run_id"]),
                count(record["attempt"], "attempt", minimum=1),
                optional(count, resumed, "resumed_from"),
            ),
            str(taken_from) if taken_from is not None else None,
            record.get("taken_back") is True,
        )
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None


def read_fence(store: ObjectStore) -> Fence | None:
    """The fence, or None when no attempt has claimed the URI (or the object is not one we wrote)."""
    record = _read_fence_record(store)
    return record.fence if record else None


class SupersededError(SpotrayError):
    """The checkpoint URI is another attempt's now (``check_fence``); this one must not write there any more.

    Its cause (spotray/contract/errors.py) depends on who holds the fence: a newer attempt of the
    same run is the normal course of things (infrastructure: this attempt just stops, spending
    nothing); another run's attempt, which came back for the claim this run took over
    (``check_fence``), means two runs write to one checkpoint URI, which they would take from each
    other for ever (bad input: give each run its own).
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
    """Raise ``SupersededError`` if ``attempt`` must stop writing; return the fence (None: none yet).

    A newer attempt of this run stops ``attempt`` (an older one's fence is taken back: it took the
    fence over meanwhile). Another run's fence must not: whatever another run left under the URI,
    this run goes on, so it takes the fence over, with a warning naming that run. Only a run that
    still runs comes back for its claim: it takes the fence back at its next check, and then the
    run that took it over stops (bad input: two runs write to one URI; the latest claim wins, as
    when every run kept to its own). An attempt on its way out (``AttemptId.leaving``) takes no
    other run's claim: it stops writing. A fence taken over no longer says which step ``attempt``
    resumed from, which pruning then no longer spares.
    """
    record = _read_fence_record(store)
    if record is None:
        return None
    fence = record.fence
    if fence.holds(attempt):
        return fence
    if fence.run_id == attempt.run_id:
        if fence.attempt > attempt.attempt:
            raise SupersededError(attempt, fence)
        log.info("%s takes the checkpoint URI %s back from its attempt %d", attempt, store.uri, fence.attempt)
        write_fence(store, attempt)
        return Fence(attempt.run_id, attempt.attempt)
    if attempt.leaving:
        # A run deleted and created again on this URI: the deleted run's job saves once more as it stops,
        # after the new run claimed the URI. Taking it back stopped the new run as bad input (issue #69).
        raise SupersededError(attempt, fence)
    taking_back = record.taken_from == attempt.run_id
    if taking_back and record.taken_back:
        raise SupersededError(attempt, fence)  # this run took over a claim whose run came back for it
    log.warning(
        "%s takes %s the checkpoint URI %s from attempt %d of run %s; if both runs still run, "
        "the one that took the other's claim over stops: give each run its own spec.checkpoint.uri",
        attempt,
        "back" if taking_back else "over",
        store.uri,
        fence.attempt,
        fence.run_id,
    )
    _take_over_fence(store, attempt, fence.run_id, taking_back)
    return Fence(attempt.run_id, attempt.attempt)
