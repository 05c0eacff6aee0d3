"""How an attempt ended (``classify_end``), and the one budget decision after it (``end_attempt``),
which the controller and local mode both make; the start of the next attempt; a refused RayJob.

How an attempt ended is decided from facts, in this order:
1. the RayJob succeeded -> Succeeded;
2. the job's own records in S3 for this very attempt (spotray/contract/attempts.py: run UID + attempt number):
   a preemption record or exit code 143 -> Preempted (it saw the spot notice and checkpointed);
3. a pod of the attempt was disrupted (``DisruptionTarget``: node deleted, evicted, spot reclaim),
   recorded on the RayJob by the pod watcher, at most ``DISRUPTION_CAUSE_WINDOW_S`` before the job
   ended -> Preempted (a node lost long before, which the job outlived, as an elastic run does,
   is not what ended it);
4. an infrastructure fault -> Interrupted (reason ``InfrastructureFault``): the driver exited 75
   (``EXIT_INFRASTRUCTURE``, read from its record or from Ray's message: its store did not answer,
   an upload failed, Ray failed under it; spotray/contract/errors.py classifies), or Ray's job
   supervisor failed before the entrypoint ran (``RAY_CLUSTER_FAULT`` in the RayJob's message). It
   spends no budget and never fails the run: the next attempt starts after a backoff of
   ``max(backoffSeconds, 15 s)`` doubled with each interruption in a row, at most 10 minutes, and
   the message says what it waits for and since when;
5. otherwise -> Failed (the training code failed or gave up on a crash loop; exit code 2 means bad
   input, which fails the run at once).
Preemptions never spend the failure budget: retrying a spot loss is the normal case.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from spotray.contract.attempts import (
    EXIT_BAD_INPUT,
    EXIT_INFRASTRUCTURE,
    EXIT_PREEMPTED,
    OUTCOME_FAILED,
    OUTCOME_INTERRUPTED,
    OUTCOME_PREEMPTED,
    OUTCOME_RUNNING,
    OUTCOME_SUCCEEDED,
    AttemptRecords,
)
from spotray.contract.names import (
    FAILED,
    JOB_SUCCEEDED,
    PENDING,
    RESUMING,
    SUCCEEDED,
    rayjob_name,
)
from spotray.contract.spec import ON_DEMAND, TrainingRun
from spotray.contract.status import (
    AttemptStatus,
    format_date_time,
    parse_timestamp,
)
from spotray.decisions.observation import RayJobView
from spotray.decisions.run_state import MAX_ATTEMPTS_KEPT, Plan, RunState
from spotray.decisions.vocabulary import (
    REASON_ATTEMPT_STARTED,
    REASON_BAD_INPUT,
    REASON_CAPACITY_FALLBACK,
    REASON_CAPACITY_WAIT_EXCEEDED,
    REASON_EVICTION_NOTICE,
    REASON_FAILURE_BUDGET_EXHAUSTED,
    REASON_INFRASTRUCTURE_FAULT,
    REASON_NODE_LOST,
    REASON_PREEMPTION_BUDGET_EXHAUSTED,
    REASON_RAYJOB_REFUSED,
    REASON_SPOT_NOTICE,
    REASON_SUCCEEDED,
    REASON_TRAINING_FAILED,
    REASON_TRAINING_FINISHED,
    Event,
    RayJobRefusal,
    bounded,
)

MAX_FAILURE_BACKOFF_S = 600
# The first wait after an infrastructure fault when spec.retry.backoffSeconds is shorter (it may be
# 0): a store or a Ray cluster that is down is not back within seconds. Doubles with each
# interruption in a row, up to MAX_FAILURE_BACKOFF_S.
MIN_INFRASTRUCTURE_BACKOFF_S = 15
# How much of the end of a job's log a message keeps when the job left no record of its own.
LOG_TAIL_CHARS = 1500


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended: its outcome (Succeeded, Preempted, Failed), a CamelCase reason, words."""

    outcome: str
    reason: str
    message: str


def classify_end(job: RayJobView, records: AttemptRecords, capacity: str | None = None) -> AttemptEnd:
    """How a finished attempt ended, from the facts (see the module docstring). ``capacity``: where the
    attempt's workers ran (status.attempts[].capacity); a notice on on-demand nodes, or to the Ray head,
    was no spot reclaim."""
    if job.job_status == JOB_SUCCEEDED:
        return AttemptEnd(OUTCOME_SUCCEEDED, REASON_TRAINING_FINISHED, "the job finished")
    exit_code = records.exit_code
    if exit_code is None and job.driver_exit_code in (EXIT_BAD_INPUT, EXIT_INFRASTRUCTURE):
        # A job that refused its input (no credentials, no bucket) or found its store down before it
        # could write a record: the driver's exit code as Ray saw it, so bad input ends the run at
        # once and an infrastructure fault spends nothing here too. Only these codes: a bare 143
        # (SIGTERM) without the job's record is no proof of an emergency checkpoint.
        exit_code = job.driver_exit_code
    if records.preempted is not None or exit_code == EXIT_PREEMPTED:
        return _notice_end(job, records, capacity)
    if job.lost_node_ended_it:
        return AttemptEnd(OUTCOME_PREEMPTED, REASON_NODE_LOST, job.disruption or "")
    recorded = (records.outcome or {}).get("detail")
    detail = str(recorded or log_summary(job.message) or "the job failed without a message")
    if exit_code == EXIT_INFRASTRUCTURE or (records.outcome is None and job.ray_cluster_fault):
        return AttemptEnd(OUTCOME_INTERRUPTED, REASON_INFRASTRUCTURE_FAULT, detail)
    if exit_code == EXIT_BAD_INPUT:
        return AttemptEnd(OUTCOME_FAILED, REASON_BAD_INPUT, detail)
    return AttemptEnd(OUTCOME_FAILED, REASON_TRAINING_FAILED, detail)


def _notice_end(job: RayJobView, records: AttemptRecords, capacity: str | None) -> AttemptEnd:
    """An attempt stopped on a notice: a spot reclaim, or an eviction where on-demand nodes got it.

    The same SIGTERM with the pods' grace period comes from a drain (maintenance, an upgrade) as
    from a cloud taking a spot VM back: which pods got it tells them apart.
    """
    step = (records.preempted or records.outcome or {}).get("step")
    where = f" at step {step}" if step is not None else ""
    message = f"stopped on a preemption notice after an emergency checkpoint{where}"
    if records.preempted is None:  # the driver's word only: the deadline came first (launcher.py)
        message = str((records.outcome or {}).get("detail") or "preempted before its emergency checkpoint")
    if job.head_disrupted and job.lost_node_ended_it:
        where = "the notice reached the Ray head, which runs on on-demand nodes"
    elif capacity == ON_DEMAND:
        where = "its workers ran on on-demand nodes"
    else:
        return AttemptEnd(OUTCOME_PREEMPTED, REASON_SPOT_NOTICE, message)
    return AttemptEnd(OUTCOME_PREEMPTED, REASON_EVICTION_NOTICE, f"{message} ({where}: an eviction, e.g. a drain)")


def log_summary(message: str) -> str:
    """A job's message with a long log cut in the middle: its first line says what ended, and the
    log's end says why (a job's error is its last words)."""
    if len(message) <= 2 * LOG_TAIL_CHARS:
        return message
    head = message.split("\n", 1)[0][:LOG_TAIL_CHARS]
    tail = message[-LOG_TAIL_CHARS:]
    tail = tail.split("\n", 1)[1] if "\n" in tail else tail  # from a whole line
    return f"{head}\n[... {len(message) - len(head) - len(tail)} characters of the log cut ...]\n{tail}"


def start_attempt(
    state: RunState,
    run: TrainingRun,
    now: datetime,
    why: str,
    ray_cluster: str | None = None,
    *,
    capacity: str | None = None,
) -> Plan:
    """Record the next attempt (number: the last one + 1) and ask for it to be created.

    ``ray_cluster``: the run's RayCluster it runs on, when the controller keeps one per run.
    ``capacity``: spot or on-demand, where its workers run (spotray/decisions/capacity_policy.py).
    """
    number = (state.current.attempt if state.current else 0) + 1
    entry = AttemptStatus(
        attempt=number,
        ray_job=rayjob_name(run.name, number),
        outcome=OUTCOME_RUNNING,
        start_time=format_date_time(now),
        ray_cluster=ray_cluster,
        capacity=capacity,
    )
    new = replace(
        state,
        phase=PENDING,
        attempts=(*state.attempts, entry)[-MAX_ATTEMPTS_KEPT:],
        # The words the next reconciles use while its Ray cluster starts: no status write just to
        # reword it (whether it resumes shows in status.attempts[].resumedFrom once the job says).
        message=f"attempt {number} starting",
        next_attempt_time=None,
    )
    return Plan(
        new, create_attempt=number, events=(Event("Normal", REASON_ATTEMPT_STARTED, f"attempt {number}: {why}"),)
    )


def record_end(state: RunState, end: AttemptEnd, now: datetime, *, counted: bool = True) -> RunState:
    """The current attempt ended as ``end``; its budget counted (unless not ``counted``: an end that
    may have been counted already). No decision about what comes next."""
    assert state.current is not None
    ended = replace(
        state.current,
        outcome=end.outcome,
        reason=end.reason,
        message=bounded(end.message),
        end_time=format_date_time(now),
    )
    return replace(
        state,
        attempts=(*state.attempts[:-1], ended),
        preemptions=state.preemptions + (counted and end.outcome == OUTCOME_PREEMPTED),
        failures=state.failures + (counted and end.outcome == OUTCOME_FAILED),
        storage_unreachable_since=None,
    )


def end_attempt(  # noqa: PLR0911 - one answer per kind of end
    state: RunState, run: TrainingRun, end: AttemptEnd, now: datetime, *, counted: bool = True
) -> Plan:
    """The budget decision, made once for the controller and local mode: the run after an attempt ended.

    Succeeded ends the run. A capacity wait past spec.retry.maxWaitSeconds (outcome Interrupted, no
    budget spent) fails it: the user's bound. A preemption spends ``maxPreemptions``, a failure ``maxFailures``; past
    its budget the run fails, else the next attempt follows after the backoff (doubling with each
    failure). Bad input (the job refused its spec or storage, and said what to fix) fails the run
    at once: the same input would be refused the same way.

    Not ``counted``: an attempt whose outcome the status did not say readably, so its end may have
    been counted already. It spends nothing and fails no budget; the next attempt still starts only
    within the budgets (``_budget_spent``).
    """
    current = state.current
    assert current is not None
    ended = record_end(state, end, now, counted=counted)
    if end.outcome == OUTCOME_SUCCEEDED:
        new = replace(ended, phase=SUCCEEDED, message=f"training finished in attempt {current.attempt}")
        return Plan(new, events=(Event("Normal", REASON_SUCCEEDED, new.message),))
    retry = run.spec.retry
    what = f"attempt {current.attempt} {end.outcome.lower()} ({end.reason}): {end.message}"
    if not counted:
        what += " (not counted against the budgets: the status did not say readably how it ended, so it may be already)"
    if end.reason == REASON_BAD_INPUT:
        fix = "Fix what it names, then create the run again (a retry would be refused the same way)."
        return _run_failed(ended, f"{what}. {fix}", REASON_BAD_INPUT)
    if end.reason == REASON_CAPACITY_WAIT_EXCEEDED:
        fix = (
            "Create the run again once capacity is back (it resumes from its checkpoints), "
            "or raise or unset spec.retry.maxWaitSeconds."
        )
        return _run_failed(ended, f"{what}. {fix}", REASON_CAPACITY_WAIT_EXCEEDED)
    if end.reason == REASON_CAPACITY_FALLBACK:
        message = f"{what}; attempt {current.attempt + 1} starts now"
        new = replace(ended, phase=RESUMING, message=message, next_attempt_time=None)
        return Plan(new, events=(Event("Normal", REASON_CAPACITY_FALLBACK, bounded(message)),), requeue_after_s=0.0)
    if end.outcome == OUTCOME_INTERRUPTED:
        return _interrupted(ended, run, what, now)
    if counted and ended.preemptions > retry.max_preemptions:
        message = f"{what}; {ended.preemptions} preemptions exceed spec.retry.maxPreemptions={retry.max_preemptions}"
        return _run_failed(
            ended, message + ". Raise the budget or use on-demand workers.", REASON_PREEMPTION_BUDGET_EXHAUSTED
        )
    if counted and ended.failures > retry.max_failures:
        message = f"{what}; {ended.failures} failures exceed spec.retry.maxFailures={retry.max_failures}"
        hint = " Read the job's logs (`spotray logs RUN`), fix the code or input, and create the run again."
        return _run_failed(ended, message + "." + hint, REASON_FAILURE_BUDGET_EXHAUSTED)
    delay = retry.backoff_seconds
    if end.outcome == OUTCOME_FAILED:
        delay = min(retry.backoff_seconds * 2 ** max(ended.failures - 1, 0), MAX_FAILURE_BACKOFF_S)
    new = replace(
        ended,
        phase=RESUMING,
        message=f"{what}; attempt {current.attempt + 1} starts in {delay} s",
        next_attempt_time=format_date_time(now + timedelta(seconds=delay)),
    )
    kind = "Warning" if end.outcome == OUTCOME_FAILED else "Normal"
    return Plan(new, events=(Event(kind, end.reason, bounded(what)),), requeue_after_s=delay)


def _run_failed(ended: RunState, message: str, reason: str) -> Plan:
    """The run Failed for ``reason`` (its Failed condition's and its Event's), ``message`` saying the fix."""
    new = replace(ended, phase=FAILED, message=message, failure_reason=reason)
    return Plan(new, events=(Event("Warning", reason, bounded(message)),))


def rayjob_refused(
    decided: Plan, run: TrainingRun, refusal: RayJobRefusal, now: datetime, start_deadline_seconds: float
) -> Plan:
    """The plan after the API server refused to create the RayJob ``decided`` asked for.

    ``decided.state`` already records the attempt (``start_attempt``, or a running attempt whose
    RayJob is missing): it stays recorded, so its start deadline runs from its start. A refused
    content fails the run at once with the server's words (bad input). Anything else is tried again
    with a growing pause, the status saying why, until the start deadline ends the attempt
    (``plan_running_attempt``): a quota that never frees never leaves a run "starting" for ever.
    """
    state = decided.state
    current = state.current
    assert current is not None
    assert current.attempt == decided.create_attempt
    if refusal.code is None:
        what = f"RayJob {current.ray_job} was not sent to the API server ({refusal.message})"
    else:
        what = f"the API server refused to create RayJob {current.ray_job} ({refusal})"
    if refusal.content_is_cause:
        fix = "shorten spec.runtimeEnv or the other fields named" if "large" in str(refusal) else "fix the fields named"
        end = AttemptEnd(OUTCOME_FAILED, REASON_BAD_INPUT, f"{what}; {fix} and create the run again")
        return end_attempt(state, run, end, now)
    started = parse_timestamp(current.start_time) or now
    waited = (now - started).total_seconds()
    until = (
        f" until the start deadline, {start_deadline_seconds:.0f} s after it began at {current.start_time}"
        if start_deadline_seconds
        else ""
    )
    message = (
        f"attempt {current.attempt} waiting: {what}; tried again{until}. A ResourceQuota, an admission policy or "
        "webhook, or the controller's role decides this: `kubectl describe quota,validatingadmissionpolicy` "
        f"and the controller's log say which"
    )
    # Half the time waited so far, within [5 s, 60 s]: a quota freed by another run is seen quickly,
    # and a long refusal costs the API server one create a minute.
    delay = min(max(waited / 2, 5.0), 60.0)
    waiting = replace(current, reason=REASON_RAYJOB_REFUSED)
    new = replace(state, phase=PENDING, message=bounded(message), attempts=(*state.attempts[:-1], waiting))
    events = (*decided.events, Event("Warning", REASON_RAYJOB_REFUSED, bounded(message)))
    return Plan(new, events=events, requeue_after_s=delay)


def interruptions_in_a_row(attempts: Sequence[AttemptStatus]) -> int:
    """How many of the last attempts kept in status ended Interrupted, one after another."""
    count = 0
    for attempt in reversed(attempts):
        if attempt.outcome != OUTCOME_INTERRUPTED:
            break
        count += 1
    return count


def _interrupted(ended: RunState, run: TrainingRun, what: str, now: datetime) -> Plan:
    """An infrastructure fault ended the attempt (already recorded in ``ended``, nothing counted): the
    next attempt after a backoff that doubles with each interruption in a row, and never a failed run.

    The message says what the run waits for (the fault, in the attempt's words) and since when: the
    start of the first attempt of the streak that status still keeps (the last ``MAX_ATTEMPTS_KEPT``).
    """
    current = ended.current
    assert current is not None
    streak = interruptions_in_a_row(ended.attempts)
    first = ended.attempts[-streak]
    delay = min(
        max(run.spec.retry.backoff_seconds, MIN_INFRASTRUCTURE_BACKOFF_S) * 2 ** min(streak - 1, 16),
        MAX_FAILURE_BACKOFF_S,
    )
    older_dropped = streak == len(ended.attempts) and first.attempt > 1
    since = f"since {'before ' if older_dropped else ''}{first.start_time or 'the start'}"
    count = f"the last {streak} attempts" if older_dropped else f"{streak} attempt{'s' if streak > 1 else ''} in a row"
    message = (
        f"{what.rstrip()}; waiting for the infrastructure: infrastructure faults {since} ({count}), which spend no "
        f"budget; attempt {current.attempt + 1} starts in {delay} s"
    )
    new = replace(
        ended, phase=RESUMING, message=message, next_attempt_time=format_date_time(now + timedelta(seconds=delay))
    )
    return Plan(new, events=(Event("Warning", REASON_INFRASTRUCTURE_FAULT, bounded(message)),), requeue_after_s=delay)
