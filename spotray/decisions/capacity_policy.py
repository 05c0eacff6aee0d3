"""Where the next attempt's workers run (spec.workers.capacity): spot, on-demand, or
spot-then-on-demand, which runs on spot and moves to on-demand nodes while spot is short:

- an attempt on spot whose workers wait for capacity past ``fallback.afterWaitSeconds`` ends
  (``CapacityFallback``: outcome Interrupted, no budget spent; spotray/decisions/capacity_wait.py)
  and the next attempt, started at once, runs on on-demand nodes;
- ``fallback.afterPreemptions`` spot reclaims that ended within ``fallback.withinSeconds``: the next
  attempt runs on on-demand nodes (a spot pool reclaimed that often costs more in restarts than
  on-demand nodes do). Only preemptions of spot workers count: not an eviction (a drain of
  on-demand nodes, a notice to the Ray head, which runs on them), nor a queue's;
- after an attempt on on-demand nodes ends, the next one tries spot again: when spot is still
  short, its wait moves it back within ``afterWaitSeconds``.

Each attempt's entry says where it ran (``status.attempts[].capacity``); status.cost prices the
on-demand part at the on-demand price (spotray/decisions/cost.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from spotray.contract.attempts import OUTCOME_PREEMPTED
from spotray.contract.spec import ON_DEMAND, SPOT, SPOT_THEN_ON_DEMAND, TrainingRun
from spotray.contract.status import AttemptStatus, parse_timestamp
from spotray.decisions.observation import HEAD_POD_NOTE
from spotray.decisions.run_state import RunState
from spotray.decisions.vocabulary import REASON_CAPACITY_FALLBACK, REASON_EVICTION_NOTICE, REASON_QUEUE_EVICTED


def next_capacity(state: RunState, run: TrainingRun, now: datetime) -> tuple[str, str]:
    """(spot or on-demand, why) for the attempt about to start after ``state.current``."""
    workers = run.spec.workers
    policy = workers.capacity_policy
    if policy != SPOT_THEN_ON_DEMAND:
        return policy, ""
    last = state.current
    if last is not None and last.reason == REASON_CAPACITY_FALLBACK:
        return ON_DEMAND, f"on on-demand nodes: attempt {last.attempt}'s spot workers found no capacity"
    fallback = workers.fallback
    if fallback.after_preemptions is not None:
        since = now - timedelta(seconds=fallback.within_seconds)
        recent = [
            attempt
            for attempt in state.attempts
            if _spot_reclaimed(attempt) and (parse_timestamp(attempt.end_time) or since) > since
        ]
        if len(recent) >= fallback.after_preemptions:
            return ON_DEMAND, (
                f"on on-demand nodes: {len(recent)} preemptions in the last {fallback.within_seconds} s "
                f"(spec.workers.fallback.afterPreemptions={fallback.after_preemptions})"
            )
    if last is not None and last.capacity == ON_DEMAND:
        return SPOT, "back on spot nodes"
    return SPOT, ""


def _spot_reclaimed(attempt: AttemptStatus) -> bool:
    """The attempt was preempted by its spot workers' loss (a spot notice, a lost node), from its status entry."""
    not_spot = (REASON_EVICTION_NOTICE, REASON_QUEUE_EVICTED)
    return (
        attempt.outcome == OUTCOME_PREEMPTED
        and attempt.capacity != ON_DEMAND
        and attempt.reason not in not_spot
        and HEAD_POD_NOTE not in attempt.message  # the head's node lost: on-demand capacity
    )


def falls_back(run: TrainingRun, capacity: str | None) -> bool:
    """Whether an attempt on ``capacity`` moves to on-demand nodes when its workers wait for capacity."""
    return run.spec.workers.capacity_policy == SPOT_THEN_ON_DEMAND and capacity == SPOT
