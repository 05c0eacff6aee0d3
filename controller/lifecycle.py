"""The life of a TrainingRun as a pure function: what we know now -> the next status and actions.

    Pending -> Running -> Succeeded
                  |  attempt ended: preemption or failure, each against its own budget
                  v
              Resuming --(backoff)--> Pending (attempt N+1, resumes from the latest complete checkpoint)
    any active phase --spec.suspend--> Suspended --unsuspend--> Pending (next attempt)
    budget exhausted or bad spec -> Failed

How an attempt ended is decided from facts, in this order:
1. the RayJob succeeded -> Succeeded;
2. the job's own markers in S3 (train/launcher.py): ``attempt-N.preempted.json`` or exit code 143
   -> Preempted (it saw the spot notice and checkpointed);
3. a pod of the attempt was disrupted (``DisruptionTarget``: node deleted, evicted, spot reclaim),
   recorded on the RayJob by the pod watcher -> Preempted;
4. otherwise -> Failed (the training code failed; exit code 2 means bad input).
Preemptions never spend the failure budget: retrying a spot loss is the normal case.

Everything here is deterministic given its inputs (``now`` included), so the unit tests cover every
transition without a cluster; controller/reconcile.py gathers the inputs and applies the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from spotray.controller.rayjob import rayjob_name
from spotray.train.runspec import TrainingRun

PENDING, RUNNING, RESUMING, SUSPENDED, SUCCEEDED, FAILED = (
    "Pending",
    "Running",
    "Resuming",
    "Suspended",
    "Succeeded",
    "Failed",
)
TERMINAL_PHASES = (SUCCEEDED, FAILED)
# Outcomes of one attempt (status.attempts[].outcome).
OUTCOME_RUNNING, OUTCOME_SUCCEEDED, OUTCOME_PREEMPTED, OUTCOME_FAILED, OUTCOME_SUSPENDED = (
    "Running",
    "Succeeded",
    "Preempted",
    "Failed",
    "Suspended",
)
EXIT_PREEMPTED = 143
EXIT_BAD_INPUT = 2
MAX_FAILURE_BACKOFF_S = 600


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class AttemptRecord:
    """One entry of status.attempts."""

    attempt: int
    rayJob: str  # noqa: N815 - the status field's name
    outcome: str
    startTime: str  # noqa: N815
    reason: str = ""
    message: str = ""
    endTime: str | None = None  # noqa: N815
    resumedFrom: int | None = None  # noqa: N815

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRecord:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


@dataclass(frozen=True)
class RunState:
    """The part of status.* that the lifecycle owns (progress and checkpoints are reported beside it)."""

    phase: str = PENDING
    attempts: tuple[AttemptRecord, ...] = ()
    message: str = ""
    next_attempt_time: str | None = None
    failure_reason: str = ""  # why the run Failed: the Failed condition's reason

    @property
    def current(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def preemptions(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == OUTCOME_PREEMPTED)

    @property
    def failures(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == OUTCOME_FAILED)

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> RunState:
        return cls(
            phase=status.get("phase") or PENDING,
            attempts=tuple(AttemptRecord.from_dict(a) for a in status.get("attempts") or []),
            message=status.get("message") or "",
            next_attempt_time=status.get("nextAttemptTime"),
            failure_reason=next(
                (
                    c.get("reason", "")
                    for c in status.get("conditions") or []
                    if c.get("type") == "Failed" and c.get("status") == "True"
                ),
                "",
            ),
        )

    def to_status(self) -> dict[str, Any]:
        current = self.current
        return {
            "phase": self.phase,
            "attempt": current.attempt if current else 0,
            "rayJob": current.rayJob if current else None,
            "preemptions": self.preemptions,
            "failures": self.failures,
            "message": self.message,
            "nextAttemptTime": self.next_attempt_time,
            "attempts": [{k: v for k, v in asdict(a).items() if v is not None} for a in self.attempts],
        }


@dataclass(frozen=True)
class RayJobView:
    """What the lifecycle needs from the current attempt's RayJob (None when it does not exist)."""

    job_status: str | None  # status.jobStatus: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    deployment_status: str | None  # status.jobDeploymentStatus: Initializing, Running, Complete, Failed, ...
    message: str = ""
    end_time: datetime | None = None
    disruption: str | None = None  # set by the pod watcher: "pod P on node N: reason"

    @property
    def finished(self) -> bool:
        return self.deployment_status in ("Complete", "Failed") or self.job_status in ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(frozen=True)
class AttemptMarkers:
    """What the job wrote about attempt N next to its checkpoints (train/launcher.py)."""

    outcome: dict[str, Any] | None = None  # _spotray/attempt-N.json
    preempted: dict[str, Any] | None = None  # _spotray/attempt-N.preempted.json


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """The lifecycle's answer: the new state, and what to do to the cluster."""

    state: RunState
    create_attempt: int | None = None
    delete_rayjob: str | None = None
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None


@dataclass(frozen=True)
class Observation:
    run: TrainingRun
    state: RunState
    job: RayJobView | None
    markers: AttemptMarkers = field(default_factory=AttemptMarkers)
    settle_seconds: float = 5.0
    # An attempt whose Ray cluster has not started this long after it began ends as a failure
    # (pods refused by admission, a quota, no capacity): it must never wait for ever. 0: no deadline.
    start_deadline_seconds: float = 0.0


def classify_end(job: RayJobView, markers: AttemptMarkers) -> tuple[str, str, str]:
    """(outcome, reason, message) for a finished attempt, from the facts (see the module docstring)."""
    if job.job_status == "SUCCEEDED":
        return OUTCOME_SUCCEEDED, "TrainingFinished", "the job finished"
    exit_code = (markers.outcome or {}).get("exit_code")
    if markers.preempted is not None or exit_code == EXIT_PREEMPTED:
        step = (markers.preempted or markers.outcome or {}).get("step")
        where = f" at step {step}" if step is not None else ""
        return OUTCOME_PREEMPTED, "SpotNotice", f"stopped on a preemption notice after an emergency checkpoint{where}"
    if job.disruption:
        return OUTCOME_PREEMPTED, "NodeLost", job.disruption
    detail = (markers.outcome or {}).get("detail") or job.message or "the job failed without a message"
    if exit_code == EXIT_BAD_INPUT:
        return OUTCOME_FAILED, "BadInput", detail
    return OUTCOME_FAILED, "TrainingFailed", detail


def _start_attempt(state: RunState, run: TrainingRun, now: datetime, why: str) -> Plan:
    number = (state.current.attempt if state.current else 0) + 1
    record = AttemptRecord(
        attempt=number, rayJob=rayjob_name(run.name, number), outcome=OUTCOME_RUNNING, startTime=timestamp(now)
    )
    resumes = "starts fresh or resumes from the latest complete checkpoint"
    new = replace(
        state,
        phase=PENDING,
        attempts=(*state.attempts, record),
        message=f"attempt {number} {resumes}",
        next_attempt_time=None,
    )
    return Plan(new, create_attempt=number, events=(Event("Normal", "AttemptStarted", f"attempt {number}: {why}"),))


def _end_attempt(state: RunState, outcome: str, reason: str, message: str, now: datetime) -> RunState:
    assert state.current is not None
    ended = replace(state.current, outcome=outcome, reason=reason, message=message, endTime=timestamp(now))
    return replace(state, attempts=(*state.attempts[:-1], ended))


def _after_failure_or_preemption(obs: Observation, state: RunState, outcome: str, now: datetime) -> Plan:
    retry = obs.run.spec.retry
    current = state.current
    assert current is not None
    what = f"attempt {current.attempt} {outcome.lower()} ({current.reason}): {current.message}"
    if state.preemptions > retry.max_preemptions:
        message = f"{what}; {state.preemptions} preemptions exceed spec.retry.maxPreemptions={retry.max_preemptions}"
        new = replace(
            state,
            phase=FAILED,
            message=message + ". Raise the budget or use on-demand workers.",
            failure_reason="PreemptionBudgetExhausted",
        )
        return Plan(new, events=(Event("Warning", "PreemptionBudgetExhausted", new.message),))
    if state.failures > retry.max_failures:
        message = f"{what}; {state.failures} failures exceed spec.retry.maxFailures={retry.max_failures}"
        hint = " Read the job's logs (`spotray logs RUN`), fix the code or input, and create the run again."
        new = replace(state, phase=FAILED, message=message + "." + hint, failure_reason="FailureBudgetExhausted")
        return Plan(new, events=(Event("Warning", "FailureBudgetExhausted", new.message),))
    delay = retry.backoff_seconds
    if outcome == OUTCOME_FAILED:
        delay = min(retry.backoff_seconds * 2 ** (state.failures - 1), MAX_FAILURE_BACKOFF_S)
    new = replace(
        state,
        phase=RESUMING,
        message=f"{what}; attempt {current.attempt + 1} starts in {delay} s",
        next_attempt_time=timestamp(now + timedelta(seconds=delay)),
    )
    kind = "Warning" if outcome == OUTCOME_FAILED else "Normal"
    return Plan(new, events=(Event(kind, current.reason, what),), requeue_after_s=delay)


def plan(obs: Observation, now: datetime) -> Plan:
    """The next state and actions for one TrainingRun."""
    state, current = obs.state, obs.state.current
    if state.phase in TERMINAL_PHASES:
        return Plan(state)
    if obs.run.spec.suspend:
        return _plan_suspended(state, now)
    if current is None or current.outcome != OUTCOME_RUNNING:
        return _plan_next_attempt(obs, now)
    return _plan_running_attempt(obs, current, now)


def _plan_suspended(state: RunState, now: datetime) -> Plan:
    message = "suspended; set spec.suspend to false to resume"
    current = state.current
    if current is not None and current.outcome == OUTCOME_RUNNING:
        ended = _end_attempt(state, OUTCOME_SUSPENDED, "Suspended", "spec.suspend is true", now)
        new = replace(ended, phase=SUSPENDED, message=message)
        return Plan(new, delete_rayjob=current.rayJob, events=(Event("Normal", "Suspended", message),))
    # Deleted again (a 404 when gone) in case the controller stopped between recording and deleting.
    return Plan(replace(state, phase=SUSPENDED, message=message), delete_rayjob=current.rayJob if current else None)


def _plan_next_attempt(obs: Observation, now: datetime) -> Plan:
    state, current = obs.state, obs.state.current
    if current is None:
        return _start_attempt(state, obs.run, now, "first attempt")
    if state.phase == SUSPENDED:
        return _start_attempt(state, obs.run, now, "resumed after suspension")
    due = parse_timestamp(state.next_attempt_time)
    if due is not None and now < due:
        return Plan(state, requeue_after_s=(due - now).total_seconds())
    return _start_attempt(state, obs.run, now, f"after attempt {current.attempt} was {current.outcome.lower()}")


def _plan_running_attempt(obs: Observation, current: AttemptRecord, now: datetime) -> Plan:
    state, job = obs.state, obs.job
    if job is None:
        # Status says the attempt runs but its RayJob is missing: the controller stopped between
        # recording the attempt and creating it (or someone deleted it). Create it; the name makes
        # this idempotent.
        return Plan(replace(state, phase=PENDING), create_attempt=current.attempt)
    if not job.finished:
        running = job.job_status == "RUNNING"
        if not running and _past_start_deadline(obs, current, now):
            return _start_deadline_exceeded(obs, current, job, now)
        message = f"attempt {current.attempt} {'running' if running else 'starting'}"
        return Plan(replace(state, phase=RUNNING if running else PENDING, message=message))

    outcome, reason, message = classify_end(job, obs.markers)
    if outcome == OUTCOME_FAILED and job.end_time is not None:
        waited = (now - job.end_time).total_seconds()
        if waited < obs.settle_seconds:
            # A disruption that caused the failure may still be on its way from the pod watcher.
            return Plan(state, requeue_after_s=obs.settle_seconds - waited)
    ended = _end_attempt(state, outcome, reason, message, now)
    if outcome == OUTCOME_SUCCEEDED:
        new = replace(ended, phase=SUCCEEDED, message=f"training finished in attempt {current.attempt}")
        return Plan(new, events=(Event("Normal", "Succeeded", new.message),))
    return _after_failure_or_preemption(obs, ended, outcome, now)


def _past_start_deadline(obs: Observation, current: AttemptRecord, now: datetime) -> bool:
    started = parse_timestamp(current.startTime)
    if not obs.start_deadline_seconds or started is None:
        return False
    return (now - started).total_seconds() > obs.start_deadline_seconds


def _start_deadline_exceeded(obs: Observation, current: AttemptRecord, job: RayJobView, now: datetime) -> Plan:
    """End an attempt that never started as a failure, and delete its RayJob (and so its pods)."""
    where = f"{job.deployment_status or 'no status yet'}" + (f": {job.message}" if job.message else "")
    message = (
        f"the Ray cluster of attempt {current.attempt} did not start within {obs.start_deadline_seconds:.0f} s "
        f"(RayJob {current.rayJob}: {where}); `kubectl get events -n {obs.run.namespace}` tells why: pods "
        "refused by admission (Pod Security, a quota), an image that cannot be pulled, or no node with capacity"
    )
    ended = _end_attempt(obs.state, OUTCOME_FAILED, "StartDeadlineExceeded", message, now)
    return replace(_after_failure_or_preemption(obs, ended, OUTCOME_FAILED, now), delete_rayjob=current.rayJob)


def conditions(state: RunState, previous: list[dict[str, Any]], generation: int, now: datetime) -> list[dict[str, Any]]:
    """status.conditions (metav1.Condition shape) for the state; a transition time changes only on a change."""
    wanted = {
        "Progressing": (state.phase in (PENDING, RUNNING, RESUMING), state.phase),
        "Succeeded": (state.phase == SUCCEEDED, "TrainingFinished" if state.phase == SUCCEEDED else state.phase),
        "Failed": (state.phase == FAILED, state.failure_reason or state.phase),
        "Suspended": (state.phase == SUSPENDED, state.phase),
    }
    old = {c.get("type"): c for c in previous}
    result = []
    for kind, (true, why) in wanted.items():
        status = "True" if true else "False"
        before = old.get(kind, {})
        changed = before.get("status") != status
        result.append(
            {
                "type": kind,
                "status": status,
                "reason": why,
                "message": state.message if true else "",
                "lastTransitionTime": timestamp(now) if changed else before.get("lastTransitionTime", timestamp(now)),
                "observedGeneration": generation,
            }
        )
    return result
