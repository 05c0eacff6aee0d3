"""The words the run's decisions speak: the reasons of attempts, conditions and Events, the Event
itself, and why the API server refused a RayJob. The controller's Kubernetes calls (controller/kube.py,
kube_events.py, rayjob.py) and local mode use the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

# status stays small whatever the job says: the API server refuses a condition message over 32 kB
# (one 40 kB traceback would make every status patch fail), and a long run has many attempts.
MAX_MESSAGE_CHARS = 4096

# Reasons: the CamelCase words of status.attempts[].reason, of the conditions and of the Events.
# How an attempt ended (status.attempts[].reason; the Event of its end carries the same word):
REASON_TRAINING_FINISHED = "TrainingFinished"  # also the Succeeded condition's
REASON_SPOT_NOTICE = "SpotNotice"
# The same notice (SIGTERM with the grace period, an emergency checkpoint) on an attempt whose workers
# ran on on-demand nodes: a drain or maintenance, not a spot reclaim. A preemption all the same.
REASON_EVICTION_NOTICE = "EvictionNotice"
REASON_NODE_LOST = "NodeLost"
REASON_QUEUE_EVICTED = "QueueEvicted"  # Kueue suspended a running attempt's RayJob: a preemption
REASON_TRAINING_FAILED = "TrainingFailed"
REASON_BAD_INPUT = "BadInput"  # also the Failed condition's: the run fails at once
REASON_START_DEADLINE_EXCEEDED = "StartDeadlineExceeded"
# Outcome Interrupted: the pods waited for capacity longer than spec.retry.maxWaitSeconds; the run fails.
REASON_CAPACITY_WAIT_EXCEEDED = "CapacityWaitExceeded"
# Outcome Interrupted: spot workers waited past spec.workers.fallback.afterWaitSeconds; the next attempt
# runs on on-demand nodes, at once (spotray/decisions/capacity_policy.py).
REASON_CAPACITY_FALLBACK = "CapacityFallback"
REASON_SUSPENDED = "Suspended"
REASON_INTERRUPTED = (
    "Interrupted"  # local mode (spotray/local/local_run.py): the command running the attempt was stopped
)
# Outcome Interrupted: an infrastructure fault (the driver's exit code 75, Ray's job supervisor); spends no budget.
REASON_INFRASTRUCTURE_FAULT = "InfrastructureFault"
# Why a run failed (the Failed condition's reason and its Event), besides BadInput:
REASON_PREEMPTION_BUDGET_EXHAUSTED = "PreemptionBudgetExhausted"
REASON_FAILURE_BUDGET_EXHAUSTED = "FailureBudgetExhausted"
REASON_INVALID_SPEC = "InvalidSpec"  # controller/reconcile.py: the spec cannot be parsed
# The next attempt's RayJob name would be longer than KubeRay accepts (past MAX_RESERVED_ATTEMPT attempts).
REASON_RAYJOB_NAME_TOO_LONG = "RayJobNameTooLong"
# Events only:
REASON_ATTEMPT_STARTED = "AttemptStarted"
REASON_SUCCEEDED = "Succeeded"
REASON_RAYJOB_NOT_OURS = "RayJobNotOurs"
REASON_WAITING_FOR_STORAGE = "WaitingForStorage"
REASON_WAITING_FOR_CAPACITY = "WaitingForCapacity"  # also the WaitingForCapacity condition's
REASON_STORAGE_UNREACHABLE = "StorageUnreachable"  # also the StorageUnreachable condition's
REASON_STATUS_UNREADABLE = "StatusUnreadable"  # a status field did not match its declaration: rebuilt
REASON_RETRY_BUDGET_SPENT = "RetryBudgetSpent"  # an ended run's status did not say Failed: nothing starts
REASON_SPARE_MOVED = "SpareMoved"  # an idle spare pod moved off its training worker's node (spare_placement.py)
# The API server did not create the attempt's RayJob: tried again. Also the reason of a running
# attempt (status.attempts[].reason) while its RayJob waits to be created: what tells it from a
# RayJob that was created and then vanished.
REASON_RAYJOB_REFUSED = "RayJobRefused"
REASON_RAYJOB_GONE = "RayJobGone"  # the attempt's RayJob was deleted before the controller saw it end

# status.conditions[].type
CONDITION_PROGRESSING = "Progressing"
CONDITION_SUCCEEDED = "Succeeded"
CONDITION_FAILED = "Failed"
CONDITION_SUSPENDED = "Suspended"
CONDITION_STORAGE_UNREACHABLE = "StorageUnreachable"
CONDITION_WAITING_FOR_CAPACITY = "WaitingForCapacity"


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters with a marker that says how much went (its head names the cause)."""
    if len(text) <= limit:
        return text
    marker = f" ...[{len(text) - limit} more characters cut; `spotray logs RUN` has all]"
    return text[: limit - len(marker)] + marker


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class RayJobRefusal:
    """Why the API server did not create a RayJob: its answer (a metav1.Status), or the controller's own
    size check before asking (``code`` None)."""

    code: int | None  # the HTTP status; None: the controller's own check of the content refused it
    reason: str  # metav1.Status reason: Forbidden, Invalid, RequestEntityTooLarge, InternalError, ...
    message: str

    @property
    def content_is_cause(self) -> bool:
        """The RayJob's content is refused: the same spec would be refused again, so it is bad input.

        400/413/422 are the schema, a CEL rule or the size; etcd's own size limit comes back as a 500
        that says so. A quota or RBAC (403), an admission policy or webhook (which an administrator
        changes, whatever status code it chose), an overloaded or failing API server (429, 5xx) may
        all pass later: those are retried until the start deadline.
        """
        if self.code is None:
            return True
        policy = "admission webhook" in self.message or "ValidatingAdmissionPolicy" in self.message
        if policy:
            return False
        return self.code in (400, 413, 422) or "request is too large" in self.message

    def __str__(self) -> str:
        said = f"{self.code} {self.reason}" if self.code is not None else self.reason
        return f"{said}: {self.message}"
