"""The plan for a running attempt: its RayJob runs, starts, ended, refused, vanished or is another
run's; its records say it ended; its head was lost; its pods wait for capacity; its start deadline passed.

A fact that cannot be read is never taken as an answer: when the store cannot be read at the end of
an attempt, nothing is decided and no budget is spent; the run waits, says why, and after
``Observation.storage_patience_seconds`` shows a ``StorageUnreachable`` condition; a run without a
Secret whose store refuses the controller's unsigned reads is judged from its RayJob alone instead
(it would wait for ever). A RayJob with the attempt's name that another TrainingRun owns (a deleted
namesake's) is never adopted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from spotray.contract.attempts import (
    EXIT_OK,
    OUTCOME_FAILED,
    OUTCOME_INTERRUPTED,
    OUTCOME_PREEMPTED,
    OUTCOME_SUCCEEDED,
    AttemptRecords,
)
from spotray.contract.names import (
    DEPLOYMENT_FAILED,
    DEPLOYMENT_VALIDATION_FAILED,
    JOB_FAILED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    PENDING,
    RUNNING,
    TERMINAL_PHASES,
)
from spotray.contract.spec import TrainingRun
from spotray.contract.status import (
    AttemptStatus,
    format_date_time,
    parse_timestamp,
)
from spotray.decisions.attempt_end import AttemptEnd, classify_end, end_attempt
from spotray.decisions.capacity_wait import (
    CAPACITY_RECHECK_S,
    plan_capacity_wait,
    start_seconds,
    wanted_capacity,
    with_wait_accounted,
)
from spotray.decisions.observation import HEAD_POD_NOTE, Observation, RayJobView
from spotray.decisions.run_state import Plan, RunState
from spotray.decisions.vocabulary import (
    REASON_BAD_INPUT,
    REASON_NODE_LOST,
    REASON_QUEUE_EVICTED,
    REASON_RAYJOB_GONE,
    REASON_RAYJOB_NOT_OURS,
    REASON_RAYJOB_REFUSED,
    REASON_START_DEADLINE_EXCEEDED,
    REASON_STORAGE_UNREACHABLE,
    REASON_TRAINING_FINISHED,
    REASON_WAITING_FOR_STORAGE,
    Event,
    bounded,
)

STORAGE_RETRY_S = 15.0
# A job that recorded how its attempt ended (its preemption once the emergency checkpoint was safe, or
# its outcome) exits within seconds, and its RayJob finishes. One still unfinished this long after the
# record is a driver that never exited (nemesis trial 39): the attempt ends from its records, and its
# RayJob is deleted. Generous: the record's time is the job's clock, the comparison the controller's.
RECORDED_END_EXIT_S = 120.0


def plan_running_attempt(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:  # noqa: PLR0911
    state, job = obs.state, obs.job
    if job is None and current.reason == REASON_RAYJOB_REFUSED:
        # The API server refused to create it (``rayjob_refused``): ask again, under the same name
        # (nothing of this attempt ever ran). A RayJob never created ends the attempt at the start
        # deadline too.
        if _past_start_deadline(obs, current, now):
            return _start_deadline_exceeded(obs, current, None, now)
        asking = replace(current, reason="")
        return Plan(
            replace(state, phase=PENDING, attempts=(*state.attempts[:-1], asking)), create_attempt=current.attempt
        )
    if job is None:
        return rayjob_gone(obs, current, now)
    if obs.run_uid is not None and job.owner_uid != obs.run_uid:
        return wait_for_foreign_rayjob(state, obs.run, current.ray_job, current.attempt, job.owner_uid)
    if job.deployment_status == DEPLOYMENT_VALIDATION_FAILED:
        return _validation_failed(obs, current, job, now)
    if not job.finished:
        return _plan_unfinished(obs, current, job, now)
    if obs.records is None and job.job_status != JOB_SUCCEEDED and not job.disruption:
        if not obs.storage_refused:
            return _wait_for_storage(obs, current, now)
        end = classify_end(job, AttemptRecords(), current.capacity)
        end = replace(end, message=f"{end.message} ({_judged_without_records(obs)})")
    else:
        end = classify_end(job, obs.records or AttemptRecords(), current.capacity)
    if end.outcome in (OUTCOME_FAILED, OUTCOME_INTERRUPTED) and job.end_time is not None:
        waited = (now - job.end_time).total_seconds()
        if waited < obs.settle_seconds:
            # A disruption that caused the failure may still be on its way from the pod watcher.
            return Plan(state, requeue_after_s=obs.settle_seconds - waited)
    return released(end_attempt(state, obs.run, end, now), end, current)


def _plan_unfinished(obs: Observation, current: AttemptStatus, job: RayJobView, now: datetime) -> Plan:  # noqa: PLR0911
    """The attempt's RayJob has not finished: it starts, runs, waits for capacity or a queue, was evicted
    from its queue, or its cluster's head was lost (one answer each)."""
    head_lost = _head_lost(obs, current)
    if head_lost is not None:
        # KubeRay would mark the RayJob Failed only after RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (300 s),
        # and a driver on the lost head is gone with it: the attempt ends now, as any lost node's does.
        # The pod watcher's note names the head ("the Ray head's pod P on node N: ..."); an older
        # controller's did not.
        words = head_lost if head_lost.startswith(HEAD_POD_NOTE) else f"the Ray head was lost: {head_lost}"
        end = AttemptEnd(OUTCOME_PREEMPTED, REASON_NODE_LOST, words)
        return released(end_attempt(obs.state, obs.run, end, now), end, current)
    recorded_end = _recorded_end(obs, current, now)
    if recorded_end is not None:
        return recorded_end
    if job.queued and obs.state.phase == RUNNING:
        return _evicted(obs, current, now)
    running = job.job_status == JOB_RUNNING
    capacity = _queued_words(obs, current) if job.queued else "" if running else wanted_capacity(obs.pods_waiting)
    state = with_wait_accounted(obs.state, current, bool(capacity), now)
    obs, current = replace(obs, state=state), state.attempts[-1]
    if capacity:
        return plan_capacity_wait(obs, current, capacity, now, spot_short=not job.queued)
    if not running and _past_start_deadline(obs, current, now):
        unreadable = obs.pods_waiting.unreadable if obs.pods_waiting is not None else ""
        if unreadable:
            return _hold_unread_pods(obs, current, unreadable)
        return _start_deadline_exceeded(obs, current, job, now)
    message = f"attempt {current.attempt} {'running' if running else 'starting'}"
    return Plan(replace(state, phase=RUNNING if running else PENDING, message=message))


def _queued_words(obs: Observation, current: AttemptStatus) -> str:
    queue = obs.run.spec.queue.name or "its queue"
    return f"queued: RayJob {current.ray_job} waits for Kueue's LocalQueue {queue} to admit it"


def _evicted(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:
    """Kueue suspended the running attempt's RayJob (its workload preempted for a higher-priority one,
    or its quota reclaimed): KubeRay deletes the cluster, whose pods' preStop drains take the emergency
    checkpoint. A preemption: the RayJob goes, and the next attempt queues again and resumes."""
    message = (
        f"Kueue evicted RayJob {current.ray_job} (a higher-priority workload took its quota, or the quota was "
        "reclaimed): the next attempt queues again and resumes from the newest complete checkpoint"
    )
    end = AttemptEnd(OUTCOME_PREEMPTED, REASON_QUEUE_EVICTED, message)
    return released(end_attempt(obs.state, obs.run, end, now), end, current)


def _hold_unread_pods(obs: Observation, current: AttemptStatus, unreadable: str) -> Plan:
    """Past the start deadline, and whether the pods wait for capacity cannot be read: decide nothing."""
    message = (
        f"attempt {current.attempt} has not started within its start deadline, and its pods cannot be read "
        f"({unreadable}): nothing is decided or spent until they can (whether they wait for capacity)"
    )
    return Plan(replace(obs.state, message=bounded(message)), requeue_after_s=CAPACITY_RECHECK_S)


def _recorded_end(obs: Observation, current: AttemptStatus, now: datetime) -> Plan | None:
    """The job recorded its attempt's end and its RayJob has not finished: wait ``RECORDED_END_EXIT_S``
    from the record for it, then end the attempt from the records and delete the RayJob. None when no
    record with a readable time was read (the reconcile reads them only once progress stalls)."""
    records = obs.records
    if records is None:
        return None
    times = [at for record in (records.outcome, records.preempted) if (at := _record_time(record)) is not None]
    end = _end_from_records(records, current.capacity)
    if not times or end is None:
        return None
    waited = (now - min(times)).total_seconds()
    if waited < RECORDED_END_EXIT_S:
        what = f"its preemption at step {records.preempted.get('step')}" if records.preempted else "its outcome"
        message = (
            f"attempt {current.attempt} stopping: the job recorded {what} {waited:.0f} s ago; its RayJob "
            f"{current.ray_job} has not finished (the attempt ends {RECORDED_END_EXIT_S:.0f} s after the record)"
        )
        return Plan(replace(obs.state, phase=RUNNING, message=message), requeue_after_s=RECORDED_END_EXIT_S - waited)
    unfinished = (
        f"RayJob {current.ray_job} was still unfinished {waited:.0f} s after the job recorded its end: a driver "
        "that did not exit; deleted"
    )
    decided = end_attempt(obs.state, obs.run, replace(end, message=f"{end.message} ({unfinished})"), now)
    return replace(decided, delete_rayjob=current.ray_job)


def _record_time(record: Mapping[str, Any] | None) -> datetime | None:
    """When the job wrote a record (its ``time``, unix seconds); None when absent or not a time: the
    run's owner writes the records, so the value may be anything."""
    at = (record or {}).get("time")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    try:
        return datetime.fromtimestamp(at, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def _head_lost(obs: Observation, current: AttemptStatus) -> str | None:
    """The pod watcher's note when the head of the run's cluster that ``current`` runs on was disrupted."""
    seen = obs.ray_cluster
    if not obs.ray_cluster_per_run or seen is None or seen.name != current.ray_cluster:
        return None
    return seen.head_lost


def released(decided: Plan, end: AttemptEnd, ended: AttemptStatus) -> Plan:
    """A preempted or interrupted attempt's RayJob is deleted as soon as its end is recorded, when the
    run goes on: KubeRay keeps a finished RayJob's cluster for its TTL (600 s) and replaces the pods
    the lost node took, so that cluster's head and new workers would hold, and race the next attempt
    for, the very capacity it waits for. A failed attempt's cluster stays for its TTL, for its logs.
    """
    goes_on = decided.state.phase not in TERMINAL_PHASES
    if goes_on and end.outcome in (OUTCOME_PREEMPTED, OUTCOME_INTERRUPTED):
        return replace(decided, delete_rayjob=ended.ray_job)
    return decided


def rayjob_gone(obs: Observation, current: AttemptStatus, now: datetime, *, counted: bool = True) -> Plan:
    """The attempt's RayJob was created and is gone: a person deleted it, or KubeRay did after it
    finished (its TTL) while the controller was away. It never runs again under this number: the
    attempt is judged from what it left (its records), and the next attempt has the next number.

    No record: nothing is known of how it ended, so nothing is spent (Interrupted), and the next
    attempt resumes from the newest complete checkpoint; the fence stops anything the old one may
    still be writing.
    """
    if obs.records is None and not obs.storage_refused:
        return _wait_for_storage(obs, current, now)
    gone = f"RayJob {current.ray_job} is gone (deleted by a person, or by KubeRay after it finished)"
    end = _end_from_records(obs.records or AttemptRecords(), current.capacity)
    if end is None:
        end = AttemptEnd(
            OUTCOME_INTERRUPTED,
            REASON_RAYJOB_GONE,
            f"{gone}, and the job left no record of how the attempt ended: nothing is spent",
        )
    else:
        end = replace(end, message=f"{end.message} ({gone})")
    if obs.storage_refused:
        end = replace(end, message=f"{end.message} ({_judged_without_records(obs)})")
    return end_attempt(obs.state, obs.run, end, now, counted=counted)


def _end_from_records(records: AttemptRecords, capacity: str | None) -> AttemptEnd | None:
    """How the attempt ended by the job's own records alone, as they would say it with its RayJob
    finished; None when it recorded nothing."""
    if records.exit_code == EXIT_OK:
        return AttemptEnd(OUTCOME_SUCCEEDED, REASON_TRAINING_FINISHED, "the job finished")
    if records.outcome is None and records.preempted is None:
        return None
    return classify_end(RayJobView(JOB_FAILED, DEPLOYMENT_FAILED), records, capacity)


def wait_for_foreign_rayjob(state: RunState, run: TrainingRun, rayjob: str, attempt: int, owner: str | None) -> Plan:
    """A RayJob with the attempt's name that another TrainingRun owns: never adopt it, wait for it to go."""
    message = (
        f"RayJob {rayjob} belongs to another TrainingRun (owner UID {owner or 'none'}), probably a deleted run "
        f"of the same name still being garbage-collected; attempt {attempt} starts once it is gone "
        f"(`kubectl delete rayjob {rayjob} -n {run.namespace}` if it stays)"
    )
    events = (Event("Warning", REASON_RAYJOB_NOT_OURS, message),) if state.message != message else ()
    return Plan(replace(state, message=message), events=events, requeue_after_s=5.0)


def _wait_for_storage(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:
    """The attempt ended but its records cannot be read: decide nothing, spend nothing, say why, retry."""
    since = parse_timestamp(obs.state.storage_unreachable_since) or now
    waited = (now - since).total_seconds()
    reason = REASON_STORAGE_UNREACHABLE if waited >= obs.storage_patience_seconds else REASON_WAITING_FOR_STORAGE
    message = (
        f"{reason}: attempt {current.attempt} ended, and how it ended cannot be read from "
        f"{obs.run.spec.checkpoint.uri} for {waited:.0f} s ({obs.storage_error or 'unknown error'}); no budget is "
        "spent until it can be read: check the S3 endpoint, the bucket and the credentials in the run's Secret"
    )
    new = replace(obs.state, message=message, storage_unreachable_since=format_date_time(since))
    news = not obs.state.message.startswith(f"{reason}:")  # one event when waiting starts, one when it is too long
    events = (Event("Warning", reason, bounded(message)),) if news else ()
    return Plan(new, events=events, requeue_after_s=STORAGE_RETRY_S)


def _judged_without_records(obs: Observation) -> str:
    return (
        "judged from the RayJob alone: the run names no Secret, so the controller reads "
        f"{obs.run.spec.checkpoint.uri} without credentials, and the store refused ({obs.storage_error}); a "
        "spot notice the job recorded counts as a failure then. Give the run spec.checkpoint.secretRef with "
        "read access for the controller to read its records"
    )


def _past_start_deadline(obs: Observation, current: AttemptStatus, now: datetime) -> bool:
    """The attempt has not started within the deadline, its waits for capacity not counted."""
    counted = start_seconds(current, now)
    if not obs.start_deadline_seconds or counted is None:
        return False
    return counted > obs.start_deadline_seconds


def _validation_failed(obs: Observation, current: AttemptStatus, job: RayJobView, now: datetime) -> Plan:
    """KubeRay refused the RayJob's content (``ValidationFailed``) and will never run it: bad input, at once."""
    message = (
        f"KubeRay refused RayJob {current.ray_job} (ValidationFailed): {job.message or 'no message'}; fix the "
        "TrainingRun's spec (or the chart's rayJob settings) and create the run again"
    )
    decided = end_attempt(obs.state, obs.run, AttemptEnd(OUTCOME_FAILED, REASON_BAD_INPUT, message), now)
    return replace(decided, delete_rayjob=current.ray_job)


def _start_deadline_exceeded(obs: Observation, current: AttemptStatus, job: RayJobView | None, now: datetime) -> Plan:
    """End an attempt that never started as a failure, and delete its RayJob (and so its pods)."""
    if job is None:
        where = f"never created; last: {obs.state.message}"
    else:
        where = f"{job.deployment_status or 'no status yet'}" + (f": {job.message}" if job.message else "")
    waited = current.capacity_waited_seconds
    after = f" after it waited {waited} s for capacity" if waited else ""
    stuck = obs.pods_waiting.stuck if obs.pods_waiting is not None else ""
    why = (
        f"{stuck}; `kubectl describe pod` tells more"
        if stuck
        else f"`kubectl get events -n {obs.run.namespace}` tells why: pods refused by admission (Pod Security, a "
        "quota), an image that cannot be pulled, a Secret or key that spec.secretEnv names and the namespace lacks"
    )
    message = (
        f"the Ray cluster of attempt {current.attempt} did not start within {obs.start_deadline_seconds:.0f} s"
        f"{after} (RayJob {current.ray_job}: {where}); {why}"
    )
    decided = end_attempt(obs.state, obs.run, AttemptEnd(OUTCOME_FAILED, REASON_START_DEADLINE_EXCEEDED, message), now)
    return replace(decided, delete_rayjob=current.ray_job)
