"""status.conditions (metav1.Condition shape) for a run's state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from spotray.contract.names import (
    FAILED,
    PENDING,
    RESUMING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
)
from spotray.contract.status import (
    Condition,
    format_date_time,
    parse_timestamp,
)
from spotray.decisions.capacity_wait import waiting_for_capacity
from spotray.decisions.observation import STORAGE_PATIENCE_SECONDS
from spotray.decisions.run_state import RunState
from spotray.decisions.vocabulary import (
    CONDITION_FAILED,
    CONDITION_PROGRESSING,
    CONDITION_STORAGE_UNREACHABLE,
    CONDITION_SUCCEEDED,
    CONDITION_SUSPENDED,
    CONDITION_WAITING_FOR_CAPACITY,
    REASON_STORAGE_UNREACHABLE,
    REASON_TRAINING_FINISHED,
    REASON_WAITING_FOR_CAPACITY,
    bounded,
)


def conditions(
    state: RunState,
    previous: Sequence[Condition],
    generation: int,
    now: datetime,
    storage_patience_s: float = STORAGE_PATIENCE_SECONDS,
) -> tuple[Condition, ...]:
    """status.conditions (metav1.Condition shape) for the state; a transition time changes only on a change."""
    wanted = {
        CONDITION_PROGRESSING: (state.phase in (PENDING, RUNNING, RESUMING), state.phase),
        CONDITION_SUCCEEDED: (
            state.phase == SUCCEEDED,
            REASON_TRAINING_FINISHED if state.phase == SUCCEEDED else state.phase,
        ),
        CONDITION_FAILED: (state.phase == FAILED, state.failure_reason or state.phase),
        CONDITION_SUSPENDED: (state.phase == SUSPENDED, state.phase),
        # True once an ended attempt's records stayed unreadable past the patience.
        CONDITION_STORAGE_UNREACHABLE: (
            _storage_unreachable(state, now, storage_patience_s),
            REASON_STORAGE_UNREACHABLE,
        ),
        # True while the current attempt's pods wait for capacity (spotray/decisions/capacity_wait.py).
        CONDITION_WAITING_FOR_CAPACITY: (waiting_for_capacity(state), REASON_WAITING_FOR_CAPACITY),
    }
    old = {c.type: c for c in previous}
    result = []
    for kind, (true, why) in wanted.items():
        status = "True" if true else "False"
        before = old.get(kind)
        unchanged = before.last_transition_time if before is not None and before.status == status else None
        result.append(
            Condition(
                type=kind,
                status=status,
                observed_generation=generation,
                last_transition_time=unchanged or format_date_time(now),
                reason=why,
                message=bounded(state.message) if true else "",
            )
        )
    return tuple(result)


def _storage_unreachable(state: RunState, now: datetime, patience_s: float) -> bool:
    since = parse_timestamp(state.storage_unreachable_since)
    return since is not None and (now - since).total_seconds() >= patience_s
