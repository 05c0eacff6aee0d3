"""The part of a TrainingRun's status that its plan owns (``RunState``), read from a stored status
that may hold anything, and the plan's answer (``Plan``): the new state and what to do to the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spotray.contract.attempts import (
    OUTCOME_FAILED,
    OUTCOME_PREEMPTED,
    OUTCOME_RUNNING,
    OUTCOME_SUCCEEDED,
    OUTCOME_SUSPENDED,
)
from spotray.contract.names import (
    PENDING,
    RESUMING,
    SUCCEEDED,
    SUSPENDED,
    rayjob_name,
)
from spotray.contract.status import AttemptStatus, RunStatus, Unreadable
from spotray.decisions.vocabulary import CONDITION_FAILED, Event, bounded

MAX_ATTEMPTS_KEPT = 20


@dataclass(frozen=True)
class RunState:
    """The part of status.* that the lifecycle owns (progress and checkpoints are reported beside it).

    ``attempts`` keeps the last ``MAX_ATTEMPTS_KEPT``; the budgets are counted in ``preemptions``
    and ``failures``, kept apart, so dropping old entries never gives a budget back.
    """

    phase: str = PENDING
    attempts: tuple[AttemptStatus, ...] = ()
    message: str = ""
    next_attempt_time: str | None = None
    failure_reason: str = ""  # why the run Failed: the Failed condition's reason
    preemptions: int = 0
    failures: int = 0
    storage_unreachable_since: str | None = None  # an attempt ended and its records cannot be read
    # What the stored status held that did not match its declaration, read as unknown (``plan``
    # reports it and the next status write replaces it); never written.
    unreadable: tuple[Unreadable, ...] = ()
    # Entries of status.attempts could not be read, so the current attempt may be later than the
    # last one here: controller/reconcile.py asks the run's RayJobs (``with_attempts_seen``).
    history_lost: bool = False

    @property
    def current(self) -> AttemptStatus | None:
        return self.attempts[-1] if self.attempts else None

    @classmethod
    def from_status(cls, status: Mapping[str, Any], run_name: str = "") -> RunState:
        """The state a stored status holds; a status without budget counters (an older controller's)
        counts them from its attempts.

        Never raises. A value that does not match its declaration is read as unknown and listed in
        ``unreadable``, and what the lifecycle needs is rebuilt from what is left, spending nothing:
        counters by counting the attempts kept (never more than were spent); the phase from the
        last attempt (``_phase_after``); an attempt whose entry is lost from status.attempt and
        status.rayJob, its outcome unknown (``OUTCOME_UNKNOWN``: ``plan`` asks its RayJob); an
        earlier attempt whose outcome is unknown leaves the history (its budget was counted when
        it ended). ``run_name`` names the RayJob of an attempt whose entry does not.
        """
        stored, unreadable = RunStatus.read(status)
        attempts, dropped = _readable_attempts(stored, run_name)
        unreadable += tuple(left for left in dropped if not any(seen.path == left.path for seen in unreadable))
        history_lost = any(_HISTORY_PROBLEM.fullmatch(problem.path) for problem in unreadable)
        return cls(
            phase=stored.phase or _phase_after(attempts[-1] if attempts else None),
            attempts=attempts,
            message=stored.message or "",
            next_attempt_time=stored.next_attempt_time,
            failure_reason=next(
                (c.reason or "" for c in stored.conditions or () if c.type == CONDITION_FAILED and c.status == "True"),
                "",
            ),
            # Never fewer than the attempts kept show: a counter patched lower (status reset by
            # someone allowed to patch it) does not give a run its budget back.
            preemptions=max(stored.preemptions or 0, sum(a.outcome == OUTCOME_PREEMPTED for a in attempts)),
            failures=max(stored.failures or 0, sum(a.outcome == OUTCOME_FAILED for a in attempts)),
            storage_unreachable_since=stored.storage_unreachable_since,
            unreadable=unreadable,
            history_lost=history_lost,
        )

    def unread(self, path: str) -> bool:
        """Whether the stored status held something unreadable at ``path`` ("nextAttemptTime")."""
        return any(problem.path == path for problem in self.unreadable)

    @property
    def unreadable_keys(self) -> frozenset[str]:
        """The keys of status that held something unreadable: the next status write sets each anew or removes it."""
        return frozenset(key for problem in self.unreadable if (key := re.split(r"[.\[]", problem.path, maxsplit=1)[0]))

    def with_attempts_seen(self, numbers: Sequence[int], run_name: str) -> RunState:
        """The state, when the attempts the run's RayJobs are for go past its history (``history_lost``):
        the latest of them is the current attempt, its outcome unknown until its RayJob says."""
        latest = max(numbers, default=0)
        if latest <= (self.current.attempt if self.current else 0):
            return self
        entry = AttemptStatus(attempt=latest, ray_job=rayjob_name(run_name, latest), outcome=OUTCOME_UNKNOWN)
        return replace(self, attempts=(*self.attempts, entry)[-MAX_ATTEMPTS_KEPT:])

    def run_status(self) -> RunStatus:
        """The lifecycle's fields of the status, messages bounded (controller/reconcile.py adds the rest)."""
        current = self.current
        return RunStatus(
            phase=self.phase,
            attempt=current.attempt if current else 0,
            preemptions=self.preemptions,
            failures=self.failures,
            ray_job=current.ray_job if current else None,
            message=bounded(self.message),
            next_attempt_time=self.next_attempt_time,
            storage_unreachable_since=self.storage_unreachable_since,
            attempts=tuple(replace(a, message=bounded(a.message)) for a in self.attempts[-MAX_ATTEMPTS_KEPT:]),
        )

    def to_status(self) -> dict[str, Any]:
        """The lifecycle's fields as a merge patch (a field it unset is removed): local mode keeps its state so."""
        return self.run_status().to_patch()


# An attempt's outcome that the status did not say (or not readably): its RayJob decides (``plan``).
OUTCOME_UNKNOWN = ""
# Unreadable paths after which status.attempts may lack entries: the list, an entry, an entry's number.
_HISTORY_PROBLEM = re.compile(r"attempts(\[\d+\](\.attempt)?)?")


def _readable_attempts(stored: RunStatus, run_name: str) -> tuple[tuple[AttemptStatus, ...], tuple[Unreadable, ...]]:
    """status.attempts as far as it can be placed: (entries, entries left out as unreadable).

    An entry without a number cannot be placed; an earlier one whose outcome is unknown is left out
    rather than guessed. A current attempt that status.attempt (or status.rayJob) names beyond the
    last entry gets an entry of its own, its outcome unknown; an entry without its RayJob's name
    gets it (``<run>-a<N>``).
    """
    dropped: list[Unreadable] = []
    kept: list[AttemptStatus] = []
    entries = stored.attempts or ()
    for index, entry in enumerate(entries):
        if entry.attempt < 1:
            dropped.append(Unreadable(f"attempts[{index}].attempt", None))
        elif entry.outcome == OUTCOME_UNKNOWN and index < len(entries) - 1:
            dropped.append(Unreadable(f"attempts[{index}].outcome", None))
        else:
            kept.append(entry)
    named = _attempt_named(stored.ray_job, run_name)
    latest = max(stored.attempt or 0, named)
    if latest > (kept[-1].attempt if kept else 0):
        ray_job = (stored.ray_job or "") if named == latest else ""
        kept.append(AttemptStatus(attempt=latest, ray_job=ray_job, outcome=OUTCOME_UNKNOWN))
    if run_name:
        kept = [replace(entry, ray_job=entry.ray_job or rayjob_name(run_name, entry.attempt)) for entry in kept]
    return tuple(kept), tuple(dropped)


def _attempt_named(ray_job: str | None, run_name: str) -> int:
    """The attempt number in a RayJob's name ``<run>-a<N>``; 0 when it names none."""
    found = re.fullmatch(r"(.+)-a([1-9]\d*)", ray_job or "")
    if found is None or (run_name and found.group(1) != run_name):
        return 0
    return int(found.group(2))


def _phase_after(current: AttemptStatus | None) -> str:
    """The phase the last attempt leaves a run in, for a status whose phase cannot be read.

    Never Failed: an ended attempt leaves the run Resuming, and ``plan`` starts the next attempt only
    within the budgets (``_budget_spent``).
    """
    if current is None or current.outcome in (OUTCOME_RUNNING, OUTCOME_UNKNOWN):
        return PENDING  # plan says Running or Pending from the attempt's RayJob
    return {OUTCOME_SUCCEEDED: SUCCEEDED, OUTCOME_SUSPENDED: SUSPENDED}.get(current.outcome, RESUMING)


@dataclass(frozen=True)
class Plan:
    """The lifecycle's answer: the new state, and what to do to the cluster."""

    state: RunState
    create_attempt: int | None = None
    delete_rayjob: str | None = None
    # The run's RayCluster to delete: its head was lost (a new generation follows), or the run ended
    # or was suspended. Deleted after the status is written, like a RayJob.
    delete_ray_cluster: str | None = None
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None
