"""Waiting for capacity: an attempt whose pods the scheduler cannot place (no node with room, a node
pool scaling up, a spot pool without nodes) waits, spending no budget, however long a spot shortage
lasts; only the user's ``spec.retry.maxWaitSeconds`` bounds it. Its start deadline counts the time
outside the waits only, so a pod placed after an hour's wait still has the whole deadline to pull its
image and start. A pod that cannot start wherever it goes (``PodsWaiting.stuck``) is no wait: the start
deadline ends its attempt as before, in that pod's words.

The attempt's entry keeps the facts (``capacity_wait_since``, ``capacity_waited_seconds``), so a
restarted controller goes on counting where the last one stopped.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from spotray.contract.attempts import OUTCOME_INTERRUPTED
from spotray.contract.names import PENDING
from spotray.contract.status import AttemptStatus, format_date_time, parse_timestamp
from spotray.decisions.attempt_end import AttemptEnd, end_attempt
from spotray.decisions.capacity_policy import falls_back
from spotray.decisions.observation import Observation, PodsWaiting
from spotray.decisions.run_state import Plan, RunState
from spotray.decisions.vocabulary import (
    REASON_CAPACITY_FALLBACK,
    REASON_CAPACITY_WAIT_EXCEEDED,
    REASON_WAITING_FOR_CAPACITY,
    Event,
    bounded,
)

# How often a waiting attempt's pods are looked at again: nothing else wakes the reconcile when a
# node comes (the pods are KubeRay's; the controller watches only their disruptions).
CAPACITY_RECHECK_S = 30.0


def wanted_capacity(waiting: PodsWaiting | None) -> str:
    """What the attempt's pods wait for when it is capacity alone ("" when they do not wait for it)."""
    if waiting is None or waiting.stuck or waiting.unreadable:
        return ""
    return waiting.capacity


def with_wait_accounted(state: RunState, current: AttemptStatus, waiting: bool, now: datetime) -> RunState:
    """The state with the current attempt's wait begun (``waiting``) or, once its pods are placed, ended:
    its seconds added to ``capacity_waited_seconds``."""
    if waiting and current.capacity_wait_since is None:
        entry = replace(current, capacity_wait_since=format_date_time(now))
    elif not waiting and current.capacity_wait_since is not None:
        entry = replace(current, capacity_wait_since=None, capacity_waited_seconds=waited_seconds(current, now))
    else:
        return state
    return replace(state, attempts=(*state.attempts[:-1], entry))


def waited_seconds(current: AttemptStatus, now: datetime) -> int:
    """The attempt's seconds spent waiting for capacity, the present wait's included."""
    since = parse_timestamp(current.capacity_wait_since)
    ongoing = max((now - since).total_seconds(), 0.0) if since is not None else 0.0
    return (current.capacity_waited_seconds or 0) + int(ongoing)


def plan_capacity_wait(
    obs: Observation, current: AttemptStatus, capacity: str, now: datetime, *, spot_short: bool = True
) -> Plan:
    """The attempt waits for ``capacity`` (the scheduler's words, or a queue's): say for what and since
    when, spend nothing, look again soon; past ``spec.retry.maxWaitSeconds`` the run fails. Pods the
    scheduler cannot place (``spot_short``) of a spot-then-on-demand run move to on-demand nodes first;
    a queue's wait does not (the queue's quota is not spot's)."""
    state, bound = obs.state, obs.run.spec.retry.max_wait_seconds
    waited = waited_seconds(current, now)
    fallback_after = obs.run.spec.workers.fallback.after_wait_seconds
    fallback = spot_short and falls_back(obs.run, current.capacity)
    if fallback and waited > fallback_after:
        message = (
            f"the spot workers of attempt {current.attempt} waited {waited} s for capacity, more than "
            f"spec.workers.fallback.afterWaitSeconds={fallback_after}: the next attempt runs on on-demand nodes "
            f"(last: {capacity})"
        )
        return _wait_ended(obs, current, AttemptEnd(OUTCOME_INTERRUPTED, REASON_CAPACITY_FALLBACK, message), now)
    if bound is not None and waited > bound:
        message = (
            f"the pods of attempt {current.attempt} waited {waited} s for capacity, more than "
            f"spec.retry.maxWaitSeconds={bound} (last: {capacity})"
        )
        return _wait_ended(obs, current, AttemptEnd(OUTCOME_INTERRUPTED, REASON_CAPACITY_WAIT_EXCEEDED, message), now)
    limit = f"at most spec.retry.maxWaitSeconds={bound}" if bound is not None else "unbounded: no maxWaitSeconds"
    words = f"attempt {current.attempt} waiting for capacity since {current.capacity_wait_since}"
    message = f"{words} (no budget is spent; {limit}): {capacity}"
    # One Event when a wait begins: the message of the last reconcile of the same wait begins alike.
    began = not state.message.startswith(words)
    events = (Event("Normal", REASON_WAITING_FOR_CAPACITY, bounded(message)),) if began else ()
    limits = [bound] if bound is not None else []
    if fallback:
        limits.append(fallback_after)
    recheck = min([CAPACITY_RECHECK_S, *(limit - waited + 1.0 for limit in limits)])
    return Plan(replace(state, phase=PENDING, message=bounded(message)), events=events, requeue_after_s=recheck)


def _wait_ended(obs: Observation, current: AttemptStatus, end: AttemptEnd, now: datetime) -> Plan:
    """The wait ends the attempt (nothing spent: Interrupted), and its RayJob goes: its pending pods
    give their place in the scheduler's (or the queue's) line back."""
    return replace(end_attempt(obs.state, obs.run, end, now), delete_rayjob=current.ray_job)


def waiting_for_capacity(state: RunState) -> bool:
    """The run's current attempt waits for capacity now (the WaitingForCapacity condition)."""
    current = state.current
    return state.phase == PENDING and current is not None and current.capacity_wait_since is not None


def start_seconds(current: AttemptStatus, now: datetime) -> float | None:
    """The attempt's time towards its start deadline: since it began, less its waits for capacity."""
    started = parse_timestamp(current.start_time)
    if started is None:
        return None
    return (now - started).total_seconds() - waited_seconds(current, now)
