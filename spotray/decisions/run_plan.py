"""The life of a TrainingRun as a pure function: what we know now -> the next status and actions.

``plan`` is the one entry: an ``Observation`` (spotray/decisions/observation.py) and ``now`` in, a
``Plan`` out (the next ``RunState`` and what to do to the cluster: spotray/decisions/run_state.py).
``RUN_TRANSITIONS`` below is the run's state machine, every change of phase it may make and which
function makes it; the tests check each decision against it (tests/lifecycle_runs.py).

The modules beside this one hold what a decision is made of: how an attempt ended and the one
budget decision (attempt_end.py: ``classify_end``, ``end_attempt``, which local mode calls too), a
running attempt's plan (running_attempt.py), the kept Ray cluster (ray_cluster.py), the status's
conditions (conditions.py) and the words of Events and reasons (vocabulary.py).

A status value that cannot be read (``RunState.from_status``: a time that is not one, a list that is
not a list, a phase it does not know) is never an exception: it is reported once in a
``StatusUnreadable`` Event and rebuilt from what is known, never starting an attempt twice,
spending a budget or failing the run for it.

Everything here is deterministic given its inputs (``now`` included), so the unit tests cover every
transition without a cluster; controller/reconcile.py gathers the inputs and applies the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from spotray.contract.attempts import (
    OUTCOME_RUNNING,
    OUTCOME_SUSPENDED,
    AttemptRecords,
)
from spotray.contract.names import (
    FAILED,
    MAX_RAYJOB_NAME_LENGTH,
    MAX_RESERVED_ATTEMPT,
    PENDING,
    RESUMING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL_PHASES,
    rayjob_name,
)
from spotray.contract.spec import MAX_NAME_LENGTH, TrainingRun
from spotray.contract.status import (
    AttemptStatus,
    format_date_time,
    parse_timestamp,
)
from spotray.decisions.attempt_end import AttemptEnd, classify_end, end_attempt, record_end, start_attempt
from spotray.decisions.capacity_policy import next_capacity
from spotray.decisions.observation import Observation
from spotray.decisions.ray_cluster import next_ray_cluster, why_not_kept
from spotray.decisions.run_state import OUTCOME_UNKNOWN, Plan, RunState
from spotray.decisions.running_attempt import plan_running_attempt, rayjob_gone, released
from spotray.decisions.vocabulary import (
    REASON_BAD_INPUT,
    REASON_RAYJOB_NAME_TOO_LONG,
    REASON_RAYJOB_REFUSED,
    REASON_RETRY_BUDGET_SPENT,
    REASON_STATUS_UNREADABLE,
    REASON_SUSPENDED,
    Event,
    bounded,
)

# The phases in which an attempt is under way or due.
ACTIVE_PHASES = (PENDING, RUNNING, RESUMING)


@dataclass(frozen=True)
class Transition:
    """One change of a run's phase that ``plan`` may make: from which phases, to which, on what, decided where."""

    sources: tuple[str, ...]
    target: str
    on: str
    by: str


# The run's state machine. Staying in a phase is no transition; Succeeded and Failed are never left.
RUN_TRANSITIONS: tuple[Transition, ...] = (
    Transition(
        (*ACTIVE_PHASES, SUSPENDED),
        PENDING,
        "an attempt starts (the first, after a backoff, after a suspension), waits for its Ray cluster, "
        "or waits for the API server to create its RayJob",
        "start_attempt, plan_running_attempt, rayjob_refused",
    ),
    Transition((PENDING, RUNNING), RUNNING, "the attempt's Ray job runs", "plan_running_attempt"),
    Transition(
        ACTIVE_PHASES,
        RESUMING,
        "the attempt ended by a preemption, an infrastructure fault or a failure within its budget: the "
        "next attempt starts after a backoff and resumes from the latest complete checkpoint",
        "end_attempt",
    ),
    Transition(ACTIVE_PHASES, SUCCEEDED, "the attempt's Ray job succeeded", "end_attempt"),
    Transition(
        (*ACTIVE_PHASES, SUSPENDED),
        FAILED,
        "bad input, a budget exhausted, or no RayJob name left for the next attempt",
        "end_attempt, rayjob_refused, _rayjob_name_too_long",
    ),
    Transition(
        ACTIVE_PHASES,
        SUSPENDED,
        "spec.suspend is true: the attempt stops after an emergency checkpoint",
        "_plan_suspended",
    ),
)


def transition(before: str, after: str) -> Transition | None:
    """The declared transition from phase ``before`` to ``after``; None when the machine has none."""
    return next((t for t in RUN_TRANSITIONS if before in t.sources and t.target == after), None)


def plan(obs: Observation, now: datetime) -> Plan:
    """The next state and actions for one TrainingRun.

    A status with unreadable values (``RunState.unreadable``) is reported in one ``StatusUnreadable``
    Warning Event naming each field and value, and planned from what could be read, rebuilt where
    the decision needs it (``_rebuilt``); the state planned is written whole, so the next reconcile
    reads a clean status and reports nothing.
    """
    if not obs.state.unreadable:
        return _plan(obs, now)
    obs = replace(obs, state=_rebuilt(obs.state, obs.run, now))
    decided = _plan(obs, now)
    state = replace(decided.state, unreadable=(), history_lost=False)
    return replace(decided, state=state, events=(status_unreadable_event(obs.state), *decided.events))


def status_unreadable_event(state: RunState) -> Event:
    """The Warning Event that says which status values could not be read, and what was made of them."""
    listed = "; ".join(f"status.{problem}" if problem.path else f"status: {problem}" for problem in state.unreadable)
    return Event(
        "Warning",
        REASON_STATUS_UNREADABLE,
        bounded(
            "the status holds values the controller cannot read, taken as unknown and rebuilt from what it "
            f"knows (no budget spent, no attempt started twice, the run not failed for it): {listed}"
        ),
    )


def _rebuilt(state: RunState, run: TrainingRun, now: datetime) -> RunState:
    """The times the decision needs, where the status held them unreadably: never sooner than they were.

    A running attempt without a readable start counts its start deadline from now; a backoff
    without a readable end waits ``spec.retry.backoffSeconds`` from now.
    """
    current = state.current
    if current is None:
        return state
    if current.outcome in (OUTCOME_RUNNING, OUTCOME_UNKNOWN) and current.start_time is None:
        current = replace(current, start_time=format_date_time(now))
        state = replace(state, attempts=(*state.attempts[:-1], current))
    waiting = current.outcome not in (OUTCOME_RUNNING, OUTCOME_UNKNOWN) and state.phase == RESUMING
    if waiting and state.next_attempt_time is None and state.unread("nextAttemptTime"):
        state = replace(
            state, next_attempt_time=format_date_time(now + timedelta(seconds=run.spec.retry.backoff_seconds))
        )
    return state


def _plan(obs: Observation, now: datetime) -> Plan:
    decided = _decide(obs, now)
    if not obs.ray_cluster_per_run or decided.delete_ray_cluster is not None:
        return decided
    current = decided.state.current
    if decided.state.phase in (*TERMINAL_PHASES, SUSPENDED) and current is not None and current.ray_cluster:
        # The run's cluster outlives its RayJobs: it goes when the run ends or is suspended (again at
        # every reconcile of a suspended run, as its RayJob is; a 404 then). The last RayJob goes with
        # it: Ray reports SUCCEEDED while KubeRay's submitter still follows the driver's log, and a
        # submitter that loses its head retries into pods that cannot start (the cluster's token
        # Secret goes with the cluster). KubeRay's finalizer lets a RayJob go even if it cannot stop it.
        wait = _suspend_checkpoint_left(obs, decided.state, current, now)
        if wait > 0:
            return replace(decided, delete_rayjob=None, delete_ray_cluster=current.ray_cluster, requeue_after_s=wait)
        return replace(decided, delete_rayjob=current.ray_job, delete_ray_cluster=current.ray_cluster)
    return decided


def _suspend_checkpoint_left(obs: Observation, state: RunState, current: AttemptStatus, now: datetime) -> float:
    """How long a suspended attempt's RayJob stays while its kept cluster goes; 0: delete it now.

    Deleting a RayJob on a kept cluster stops its Ray job (KubeRay's finalizer): the driver ends at once
    (train/launch/driver_notice.py ``stop_without_drain``) and its workers with it, before any checkpoint,
    so a suspend lost the steps since the last one (issue #69). Deleting the cluster first gives every
    pod its preStop hook, which drains its node (the head's, every node) as a spot notice does: the
    workers take an emergency checkpoint and stop, and the driver records it and ends. So the RayJob
    stays until its job has ended, or for ``suspend_checkpoint_seconds`` after the suspend at most.
    """
    job = obs.job
    if state.phase != SUSPENDED or job is None or job.finished or current.outcome != OUTCOME_SUSPENDED:
        return 0.0
    if obs.run_uid is not None and job.owner_uid != obs.run_uid:
        return 0.0
    suspended_at = parse_timestamp(current.end_time) or now
    left = obs.suspend_checkpoint_seconds - (now - suspended_at).total_seconds()
    return min(left, 10.0) if left > 0 else 0.0


def _decide(obs: Observation, now: datetime) -> Plan:
    state, current = obs.state, obs.state.current
    if state.phase in TERMINAL_PHASES:
        return Plan(state)
    if obs.run.spec.suspend:
        return _plan_suspended(state, now)
    if current is not None and current.outcome == OUTCOME_UNKNOWN:
        return _plan_unknown_outcome(obs, current, now)
    if current is None or current.outcome != OUTCOME_RUNNING:
        return _plan_next_attempt(obs, now)
    return plan_running_attempt(obs, current, now)


def _plan_unknown_outcome(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:
    """The current attempt's outcome could not be read from the status: its RayJob says.

    Not over (or missing, or another run's): it runs, and its end will be counted when it comes,
    as for any running attempt. Over: its end is recorded from the facts as ever, but not counted,
    since the status may have counted it already; nothing else is started for it.
    """
    job = obs.job
    if job is None and current.reason != REASON_RAYJOB_REFUSED:
        return rayjob_gone(obs, current, now, counted=False)
    ours = job is not None and (obs.run_uid is None or job.owner_uid == obs.run_uid)
    if job is None or not ours or not job.finished:
        running = replace(current, outcome=OUTCOME_RUNNING, start_time=current.start_time or format_date_time(now))
        state = replace(obs.state, attempts=(*obs.state.attempts[:-1], running))
        return plan_running_attempt(replace(obs, state=state), running, now)
    end = classify_end(job, obs.records or AttemptRecords(), current.capacity)
    return released(end_attempt(obs.state, obs.run, end, now, counted=False), end, current)


def _plan_suspended(state: RunState, now: datetime) -> Plan:
    message = "suspended; set spec.suspend to false to resume"
    current = state.current
    if current is not None and current.outcome in (OUTCOME_RUNNING, OUTCOME_UNKNOWN):
        ended = record_end(state, AttemptEnd(OUTCOME_SUSPENDED, REASON_SUSPENDED, "spec.suspend is true"), now)
        new = replace(ended, phase=SUSPENDED, message=message)
        return Plan(new, delete_rayjob=current.ray_job, events=(Event("Normal", REASON_SUSPENDED, message),))
    # Deleted again (a 404 when gone) in case the controller stopped between recording and deleting.
    return Plan(replace(state, phase=SUSPENDED, message=message), delete_rayjob=current.ray_job if current else None)


def _plan_next_attempt(obs: Observation, now: datetime) -> Plan:
    state, current = obs.state, obs.state.current
    if current is None:
        return _start_attempt(obs, now, "first attempt")
    spent = _budget_spent(state, obs.run)
    if spent:
        return _hold(state, current, spent)
    if len(rayjob_name(obs.run.name, current.attempt + 1)) > MAX_RAYJOB_NAME_LENGTH:
        return _rayjob_name_too_long(state, obs.run, current.attempt + 1)
    if state.phase == SUSPENDED:
        return _start_attempt(obs, now, "resumed after suspension")
    due = parse_timestamp(state.next_attempt_time)
    if due is not None and now < due:
        return Plan(state, requeue_after_s=(due - now).total_seconds())
    return _start_attempt(obs, now, f"after attempt {current.attempt} was {current.outcome.lower()}")


def _start_attempt(obs: Observation, now: datetime, why: str) -> Plan:
    capacity, where = next_capacity(obs.state, obs.run, now)
    if where:
        why += f", {where}"
    ray_cluster, old = next_ray_cluster(obs, capacity)
    if ray_cluster is not None and old is None and obs.state.current is not None:
        why += f", on the run's Ray cluster {ray_cluster} that survived it"
    elif ray_cluster is not None and old is not None:
        why += f", on a new Ray cluster {ray_cluster} ({old}: {why_not_kept(obs, old, capacity)})"
    # A suspended attempt's RayJob still there (its emergency checkpoint was waited for on a kept cluster,
    # ``_suspend_checkpoint_left``) must not outlive the attempt that replaces it. Any other ended
    # attempt's RayJob stays for its TTL: its driver's logs are read from it (`spotray logs`).
    current = obs.state.current
    ours = obs.job is not None and (obs.run_uid is None or obs.job.owner_uid == obs.run_uid)
    leftover = current.ray_job if current is not None and ours and current.outcome == OUTCOME_SUSPENDED else None
    started = start_attempt(obs.state, obs.run, now, why, ray_cluster, capacity=capacity)
    return replace(started, delete_ray_cluster=old, delete_rayjob=leftover)


def _budget_spent(state: RunState, run: TrainingRun) -> str:
    """Why no further attempt may start, though the run is not Failed; "" when one may.

    ``end_attempt`` fails a run whose budget an attempt exceeds, so with a readable status this
    never holds; it does when the phase could not be read (``_phase_after`` never says Failed).
    """
    retry, current = run.spec.retry, state.current
    if state.preemptions > retry.max_preemptions:
        return f"{state.preemptions} preemptions exceed spec.retry.maxPreemptions={retry.max_preemptions}"
    if state.failures > retry.max_failures:
        return f"{state.failures} failures exceed spec.retry.maxFailures={retry.max_failures}"
    if current is not None and current.reason == REASON_BAD_INPUT:
        return "the job refused its input (a retry would be refused the same way)"
    return ""


def _hold(state: RunState, current: AttemptStatus, why: str) -> Plan:
    """Start nothing and fail nothing: a person decides (say so once)."""
    message = (
        f"attempt {current.attempt} ended {current.outcome.lower()} ({current.reason or 'no reason recorded'}) "
        f"and {why}, but the status does not say the run failed: no attempt starts. Raise spec.retry to go on, "
        "or delete the run."
    )
    events = (Event("Warning", REASON_RETRY_BUDGET_SPENT, message),) if state.message != message else ()
    return Plan(replace(state, message=message, next_attempt_time=None), events=events)


def _rayjob_name_too_long(state: RunState, run: TrainingRun, number: int) -> Plan:
    """The run cannot go on under its name: KubeRay would refuse the next attempt's RayJob (ValidationFailed),
    and the run would say "starting" for ever. Only a run of the longest names gets here, past
    ``MAX_RESERVED_ATTEMPT`` attempts (spotray/contract/names.py); it fails, saying what to do."""
    job = rayjob_name(run.name, number)
    message = (
        f"attempt {number} would be RayJob {job} ({len(job)} characters), and KubeRay refuses RayJob names over "
        f"{MAX_RAYJOB_NAME_LENGTH} characters (a name of {MAX_NAME_LENGTH} has room for {MAX_RESERVED_ATTEMPT} "
        "attempts). Create the run again under a shorter name, in the same namespace, with the same "
        "spec.checkpoint.uri (and keySecret, if set): it resumes from the latest checkpoint."
    )
    new = replace(
        state, phase=FAILED, message=message, next_attempt_time=None, failure_reason=REASON_RAYJOB_NAME_TOO_LONG
    )
    return Plan(new, events=(Event("Warning", REASON_RAYJOB_NAME_TOO_LONG, message),))
