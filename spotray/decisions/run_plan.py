"""The life of a TrainingRun as a pure function: what we know now -> the next status and actions.

    Pending -> Running -> Succeeded
                  |  attempt ended: preemption or failure, each against its own budget
                  v
              Resuming --(backoff)--> Pending (attempt N+1, resumes from the latest complete checkpoint)
    any active phase --spec.suspend--> Suspended --unsuspend--> Pending (next attempt)
    budget exhausted or bad spec -> Failed

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
Preemptions never spend the failure budget: retrying a spot loss is the normal case. A fact that
cannot be read is never taken as an answer: when the store cannot be read at the end of an
attempt, nothing is decided and no budget is spent; the run waits, says why, and after
``Observation.storage_patience_seconds`` (``SPOTRAY_STORAGE_PATIENCE_SECONDS``, controller/config.py) shows a
``StorageUnreachable`` condition; a run without a Secret whose store refuses the controller's
unsigned reads is judged from its RayJob alone instead (it would wait for ever). A RayJob with the
attempt's name that another TrainingRun owns (a deleted namesake's) is never adopted. A RayJob the
API server refuses to create, or KubeRay marks ``ValidationFailed``, fails the run at once when its
content is the cause (bad input), and is tried again until the start deadline otherwise
(``rayjob_refused``). ``end_attempt`` is the one
budget decision; local mode (spotray/local.py) calls it too. A status value that cannot be read
(``RunState.from_status``: a time that is not one, a list that is not a list, a phase it does not
know) is never an exception: it is reported once in a ``StatusUnreadable`` Event and rebuilt from
what is known, never starting an attempt twice, spending a budget or failing the run for it.

Everything here is deterministic given its inputs (``now`` included), so the unit tests cover every
transition without a cluster; controller/reconcile.py gathers the inputs and applies the plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from spotray.contract.attempts import (
    EXIT_BAD_INPUT,
    EXIT_INFRASTRUCTURE,
    EXIT_OK,
    EXIT_PREEMPTED,
    OUTCOME_FAILED,
    OUTCOME_INTERRUPTED,
    OUTCOME_PREEMPTED,
    OUTCOME_RUNNING,
    OUTCOME_SUCCEEDED,
    OUTCOME_SUSPENDED,
    AttemptRecords,
)
from spotray.contract.names import (
    DEPLOYMENT_ENDED,
    DEPLOYMENT_FAILED,
    DEPLOYMENT_VALIDATION_FAILED,
    FAILED,
    JOB_ENDED,
    JOB_FAILED,
    JOB_PENDING,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    MAX_RAYJOB_NAME_LENGTH,
    MAX_RESERVED_ATTEMPT,
    PENDING,
    RESUMING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL_PHASES,
    ray_cluster_generation,
    ray_cluster_name,
    rayjob_name,
)
from spotray.contract.spec import MAX_NAME_LENGTH, TrainingRun
from spotray.contract.status import (
    AttemptStatus,
    Condition,
    RunStatus,
    Unreadable,
    format_date_time,
    parse_date_time,
)

# An attempt ended and its records cannot be read: the run waits (no budget spent) and after this
# long shows a StorageUnreachable condition; the controller's SPOTRAY_STORAGE_PATIENCE_SECONDS
# (controller/config.py) sets it, and the chart's controller.storagePatienceSeconds repeats it
# (tests/unit/test_deploy_files.py checks).
STORAGE_PATIENCE_SECONDS = 600
MAX_FAILURE_BACKOFF_S = 600
# The first wait after an infrastructure fault when spec.retry.backoffSeconds is shorter (it may be
# 0): a store or a Ray cluster that is down is not back within seconds. Doubles with each
# interruption in a row, up to MAX_FAILURE_BACKOFF_S.
MIN_INFRASTRUCTURE_BACKOFF_S = 15
# status stays small whatever the job says: the API server refuses a condition message over 32 kB
# (one 40 kB traceback would make every status patch fail), and a long run has many attempts.
MAX_MESSAGE_CHARS = 4096
MAX_ATTEMPTS_KEPT = 20
STORAGE_RETRY_S = 15.0
# Ray's job supervisor says how the entrypoint ended in the job's message, which KubeRay copies into
# the RayJob's status.message: "Job entrypoint command failed with exit code N, last available logs ...".
RAY_EXIT_CODE = re.compile(r"^Job entrypoint command failed with exit code (-?\d+)\b")
# Ray's job manager's words when the Ray job failed before its entrypoint ran (its supervisor actor
# could not be scheduled, died, did not start in time, or was lost: ray/dashboard/modules/job/
# job_manager.py), which KubeRay copies the same way: a fault of Ray's cluster, never of the training code.
RAY_CLUSTER_FAULT = re.compile(
    r"^(Job supervisor actor (could not be scheduled|died|failed to start within)"
    r"|Unexpected error occurred: failed to get job supervisor)"
)
# How much of the end of a job's log a message keeps when the job left no record of its own.
LOG_TAIL_CHARS = 1500
# A job that a node loss ends fails within a minute or two of it (the head's pod gone, KubeRay
# notices); one that fails later outlived the loss: Ray Train restarted its workers, or an elastic
# group went on smaller. Its failure is then the code's, and spends the failure budget.
DISRUPTION_CAUSE_WINDOW_S = 300
# A job that recorded how its attempt ended (its preemption once the emergency checkpoint was safe, or
# its outcome) exits within seconds, and its RayJob finishes. One still unfinished this long after the
# record is a driver that never exited (nemesis trial 39): the attempt ends from its records, and its
# RayJob is deleted. Generous: the record's time is the job's clock, the comparison the controller's.
RECORDED_END_EXIT_S = 120.0
# How stale a running attempt's progress is before the controller reads its records while its RayJob
# runs (controller/reconcile.py): a training job reports every few seconds, so only a stopped one costs reads.
STALLED_PROGRESS_S = 30.0
# Attempts in a row ended by infrastructure faults on one kept Ray cluster (controller.rayClusterPerRun)
# after which the next attempt gets a new one (``next_ray_cluster``).
KEPT_CLUSTER_INTERRUPTIONS = 2

# Reasons: the CamelCase words of status.attempts[].reason, of the conditions and of the Events.
# How an attempt ended (status.attempts[].reason; the Event of its end carries the same word):
REASON_TRAINING_FINISHED = "TrainingFinished"  # also the Succeeded condition's
REASON_SPOT_NOTICE = "SpotNotice"
REASON_NODE_LOST = "NodeLost"
REASON_TRAINING_FAILED = "TrainingFailed"
REASON_BAD_INPUT = "BadInput"  # also the Failed condition's: the run fails at once
REASON_START_DEADLINE_EXCEEDED = "StartDeadlineExceeded"
REASON_SUSPENDED = "Suspended"
REASON_INTERRUPTED = "Interrupted"  # local mode (spotray/local.py): the command running the attempt was stopped
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


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters with a marker that says how much went (its head names the cause)."""
    if len(text) <= limit:
        return text
    marker = f" ...[{len(text) - limit} more characters cut; `spotray logs RUN` has all]"
    return text[: limit - len(marker)] + marker


def timestamp(moment: datetime) -> str:
    """A time as the controller writes it (spotray/contract/status.py ``format_date_time``)."""
    return format_date_time(moment)


def parse_timestamp(text: str | None) -> datetime | None:
    """A status time in any RFC 3339 form (spotray/contract/status.py ``parse_date_time``); None when unset.

    A time read through ``RunStatus``/``RunState.from_status`` was checked there; an unchecked
    one (a RayJob's, a pod's, an annotation) goes through ``unchecked_timestamp``.
    """
    if not text:
        return None
    return parse_date_time(text)


def unchecked_timestamp(value: object) -> datetime | None:
    """A time from a field anyone may write (an annotation, a RayJob's or a pod's status), as RFC 3339
    text or as the Kubernetes client's datetime; None when it is missing or not a time."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_timestamp(str(value)) if value else None
    except ValueError:
        return None


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
class RayJobView:
    """What the lifecycle needs from the current attempt's RayJob (None when it does not exist)."""

    job_status: str | None  # status.jobStatus: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    deployment_status: str | None  # status.jobDeploymentStatus: Initializing, Running, Complete, Failed, ...
    message: str = ""
    end_time: datetime | None = None
    disruption: str | None = None  # set by the pod watcher: "pod P on node N: reason"
    disrupted_at: datetime | None = None  # when that pod was disrupted, where the watcher knew
    owner_uid: str | None = None  # the TrainingRun that owns it (its controller owner reference)
    exit_code: int | None = None  # the driver's, where known first-hand (local mode)

    @property
    def driver_exit_code(self) -> int | None:
        """The driver's exit code: known first-hand, or as Ray's job supervisor wrote it in the message."""
        if self.exit_code is not None:
            return self.exit_code
        found = RAY_EXIT_CODE.match(self.message)
        return int(found.group(1)) if found else None

    @property
    def ray_cluster_fault(self) -> bool:
        """Ray's job supervisor failed before the entrypoint ran (``RAY_CLUSTER_FAULT``): Ray's cluster, not the job."""
        return RAY_CLUSTER_FAULT.match(self.message) is not None

    @property
    def lost_node_ended_it(self) -> bool:
        """A pod's node was lost, and not so long before the job ended that the job went on without it.

        With no time to compare (an annotation from an older controller, local mode), the report stands.
        """
        if not self.disruption:
            return False
        if self.disrupted_at is None or self.end_time is None:
            return True
        return self.disrupted_at >= self.end_time - timedelta(seconds=DISRUPTION_CAUSE_WINDOW_S)

    @property
    def finished(self) -> bool:
        return self.deployment_status in DEPLOYMENT_ENDED or self.job_status in JOB_ENDED

    @property
    def submitted(self) -> bool:
        """The job was handed to Ray, so it may have written progress; not still waiting for its cluster."""
        cluster_starting = self.deployment_status in (None, "", "New", "Initializing")
        return self.finished or not cluster_starting or self.job_status not in (None, "", JOB_PENDING)


@dataclass(frozen=True)
class RayClusterView:
    """The run's RayCluster its last attempt ran on, as read (``ray_cluster_per_run``)."""

    name: str
    head_lost: str | None = None  # set by the pod watcher: "pod P on node N: reason"
    owner_uid: str | None = None  # the TrainingRun that owns it
    spare_moved: str | None = None  # the last idle spare moved off a worker's node (controller/spare_placement.py)
    shape: str | None = None  # the hash of the spec it was made from (controller/rayjob.py ``ray_cluster_shape``)


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
    # The run's RayCluster to delete: its head was lost (a new generation follows), or the run ended
    # or was suspended. Deleted after the status is written, like a RayJob.
    delete_ray_cluster: str | None = None
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None


@dataclass(frozen=True)
class Observation:
    """Every fact one decision needs, gathered before it (controller/reconcile.py)."""

    run: TrainingRun
    state: RunState
    job: RayJobView | None
    # What the job wrote about the current attempt; None: the store could not be read (unknown,
    # which is not "nothing written": the decision waits for it).
    records: AttemptRecords | None = field(default_factory=AttemptRecords)
    run_uid: str | None = None  # the TrainingRun's metadata.uid: a RayJob owned by another UID is not ours
    storage_error: str = ""
    # The store answered and refused the controller, which has no credentials it may use for this run
    # (it names no Secret): the records will never be readable, so the RayJob's facts alone decide.
    storage_refused: bool = False
    settle_seconds: float = 5.0
    # An attempt whose Ray cluster has not started this long after it began ends as a failure
    # (pods refused by admission, a quota, no capacity): it must never wait for ever. 0: no deadline.
    start_deadline_seconds: float = 0.0
    # How long an ended attempt's records may stay unreadable before the run shows StorageUnreachable.
    storage_patience_seconds: float = STORAGE_PATIENCE_SECONDS
    # One RayCluster per run, kept across attempts (controller/config.py ``ray_cluster_per_run``), and
    # the one the last attempt ran on as read (None: it does not exist, or there is none yet).
    ray_cluster_per_run: bool = False
    ray_cluster: RayClusterView | None = None
    # The shape of the RayCluster the run's spec makes now; a kept cluster of another is replaced.
    ray_cluster_shape: str | None = None
    # How long a suspended attempt's RayJob outlives its kept cluster's deletion (``_plan``): the workers'
    # grace period, in which the nodes' preStop drains give the emergency checkpoint, and a margin.
    suspend_checkpoint_seconds: float = 0.0


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended: its outcome (Succeeded, Preempted, Failed), a CamelCase reason, words."""

    outcome: str
    reason: str
    message: str


def classify_end(job: RayJobView, records: AttemptRecords) -> AttemptEnd:
    """How a finished attempt ended, from the facts (see the module docstring)."""
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
        step = (records.preempted or records.outcome or {}).get("step")
        where = f" at step {step}" if step is not None else ""
        message = f"stopped on a preemption notice after an emergency checkpoint{where}"
        if records.preempted is None:  # the driver's word only: the deadline came first (launcher.py)
            message = str((records.outcome or {}).get("detail") or "preempted before its emergency checkpoint")
        return AttemptEnd(OUTCOME_PREEMPTED, REASON_SPOT_NOTICE, message)
    if job.lost_node_ended_it:
        return AttemptEnd(OUTCOME_PREEMPTED, REASON_NODE_LOST, job.disruption or "")
    recorded = (records.outcome or {}).get("detail")
    detail = str(recorded or log_summary(job.message) or "the job failed without a message")
    if exit_code == EXIT_INFRASTRUCTURE or (records.outcome is None and job.ray_cluster_fault):
        return AttemptEnd(OUTCOME_INTERRUPTED, REASON_INFRASTRUCTURE_FAULT, detail)
    if exit_code == EXIT_BAD_INPUT:
        return AttemptEnd(OUTCOME_FAILED, REASON_BAD_INPUT, detail)
    return AttemptEnd(OUTCOME_FAILED, REASON_TRAINING_FAILED, detail)


def log_summary(message: str) -> str:
    """A job's message with a long log cut in the middle: its first line says what ended, and the
    log's end says why (a job's error is its last words)."""
    if len(message) <= 2 * LOG_TAIL_CHARS:
        return message
    head = message.split("\n", 1)[0][:LOG_TAIL_CHARS]
    tail = message[-LOG_TAIL_CHARS:]
    tail = tail.split("\n", 1)[1] if "\n" in tail else tail  # from a whole line
    return f"{head}\n[... {len(message) - len(head) - len(tail)} characters of the log cut ...]\n{tail}"


def start_attempt(state: RunState, run: TrainingRun, now: datetime, why: str, ray_cluster: str | None = None) -> Plan:
    """Record the next attempt (number: the last one + 1) and ask for it to be created.

    ``ray_cluster``: the run's RayCluster it runs on, when the controller keeps one per run.
    """
    number = (state.current.attempt if state.current else 0) + 1
    entry = AttemptStatus(
        attempt=number,
        ray_job=rayjob_name(run.name, number),
        outcome=OUTCOME_RUNNING,
        start_time=timestamp(now),
        ray_cluster=ray_cluster,
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
        state.current, outcome=end.outcome, reason=end.reason, message=bounded(end.message), end_time=timestamp(now)
    )
    return replace(
        state,
        attempts=(*state.attempts[:-1], ended),
        preemptions=state.preemptions + (counted and end.outcome == OUTCOME_PREEMPTED),
        failures=state.failures + (counted and end.outcome == OUTCOME_FAILED),
        storage_unreachable_since=None,
    )


def end_attempt(state: RunState, run: TrainingRun, end: AttemptEnd, now: datetime, *, counted: bool = True) -> Plan:
    """The budget decision, made once for the controller and local mode: the run after an attempt ended.

    Succeeded ends the run. A preemption spends ``maxPreemptions``, a failure ``maxFailures``; past
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
        message = f"{what}. Fix what it names, then create the run again (a retry would be refused the same way)."
        new = replace(ended, phase=FAILED, message=message, failure_reason=REASON_BAD_INPUT)
        return Plan(new, events=(Event("Warning", REASON_BAD_INPUT, bounded(message)),))
    if end.outcome == OUTCOME_INTERRUPTED:
        return _interrupted(ended, run, what, now)
    if counted and ended.preemptions > retry.max_preemptions:
        message = f"{what}; {ended.preemptions} preemptions exceed spec.retry.maxPreemptions={retry.max_preemptions}"
        new = replace(
            ended,
            phase=FAILED,
            message=message + ". Raise the budget or use on-demand workers.",
            failure_reason=REASON_PREEMPTION_BUDGET_EXHAUSTED,
        )
        return Plan(new, events=(Event("Warning", REASON_PREEMPTION_BUDGET_EXHAUSTED, bounded(new.message)),))
    if counted and ended.failures > retry.max_failures:
        message = f"{what}; {ended.failures} failures exceed spec.retry.maxFailures={retry.max_failures}"
        hint = " Read the job's logs (`spotray logs RUN`), fix the code or input, and create the run again."
        new = replace(ended, phase=FAILED, message=message + "." + hint, failure_reason=REASON_FAILURE_BUDGET_EXHAUSTED)
        return Plan(new, events=(Event("Warning", REASON_FAILURE_BUDGET_EXHAUSTED, bounded(new.message)),))
    delay = retry.backoff_seconds
    if end.outcome == OUTCOME_FAILED:
        delay = min(retry.backoff_seconds * 2 ** max(ended.failures - 1, 0), MAX_FAILURE_BACKOFF_S)
    new = replace(
        ended,
        phase=RESUMING,
        message=f"{what}; attempt {current.attempt + 1} starts in {delay} s",
        next_attempt_time=timestamp(now + timedelta(seconds=delay)),
    )
    kind = "Warning" if end.outcome == OUTCOME_FAILED else "Normal"
    return Plan(new, events=(Event(kind, end.reason, bounded(what)),), requeue_after_s=delay)


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


def rayjob_refused(
    decided: Plan, run: TrainingRun, refusal: RayJobRefusal, now: datetime, start_deadline_seconds: float
) -> Plan:
    """The plan after the API server refused to create the RayJob ``decided`` asked for.

    ``decided.state`` already records the attempt (``start_attempt``, or a running attempt whose
    RayJob is missing): it stays recorded, so its start deadline runs from its start. A refused
    content fails the run at once with the server's words (bad input). Anything else is tried again
    with a growing pause, the status saying why, until the start deadline ends the attempt
    (``_plan_running_attempt``): a quota that never frees never leaves a run "starting" for ever.
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
    new = replace(ended, phase=RESUMING, message=message, next_attempt_time=timestamp(now + timedelta(seconds=delay)))
    return Plan(new, events=(Event("Warning", REASON_INFRASTRUCTURE_FAULT, bounded(message)),), requeue_after_s=delay)


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
        current = replace(current, start_time=timestamp(now))
        state = replace(state, attempts=(*state.attempts[:-1], current))
    waiting = current.outcome not in (OUTCOME_RUNNING, OUTCOME_UNKNOWN) and state.phase == RESUMING
    if waiting and state.next_attempt_time is None and state.unread("nextAttemptTime"):
        state = replace(state, next_attempt_time=timestamp(now + timedelta(seconds=run.spec.retry.backoff_seconds)))
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
    return _plan_running_attempt(obs, current, now)


def _plan_unknown_outcome(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:
    """The current attempt's outcome could not be read from the status: its RayJob says.

    Not over (or missing, or another run's): it runs, and its end will be counted when it comes,
    as for any running attempt. Over: its end is recorded from the facts as ever, but not counted,
    since the status may have counted it already; nothing else is started for it.
    """
    job = obs.job
    if job is None and current.reason != REASON_RAYJOB_REFUSED:
        return _rayjob_gone(obs, current, now, counted=False)
    ours = job is not None and (obs.run_uid is None or job.owner_uid == obs.run_uid)
    if job is None or not ours or not job.finished:
        running = replace(current, outcome=OUTCOME_RUNNING, start_time=current.start_time or timestamp(now))
        state = replace(obs.state, attempts=(*obs.state.attempts[:-1], running))
        return _plan_running_attempt(replace(obs, state=state), running, now)
    end = classify_end(job, obs.records or AttemptRecords())
    return _released(end_attempt(obs.state, obs.run, end, now, counted=False), end, current)


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
    ray_cluster, old = next_ray_cluster(obs)
    if ray_cluster is not None and old is None and obs.state.current is not None:
        why += f", on the run's Ray cluster {ray_cluster} that survived it"
    elif ray_cluster is not None and old is not None:
        why += f", on a new Ray cluster {ray_cluster} ({old}: {_why_not_kept(obs, old)})"
    # A suspended attempt's RayJob still there (its emergency checkpoint was waited for on a kept cluster,
    # ``_suspend_checkpoint_left``) must not outlive the attempt that replaces it. Any other ended
    # attempt's RayJob stays for its TTL: its driver's logs are read from it (`spotray logs`).
    current = obs.state.current
    ours = obs.job is not None and (obs.run_uid is None or obs.job.owner_uid == obs.run_uid)
    leftover = current.ray_job if current is not None and ours and current.outcome == OUTCOME_SUSPENDED else None
    started = start_attempt(obs.state, obs.run, now, why, ray_cluster)
    return replace(started, delete_ray_cluster=old, delete_rayjob=leftover)


def next_ray_cluster(obs: Observation) -> tuple[str | None, str | None]:
    """(the RayCluster the next attempt runs on, the run's old one to delete), with a cluster per run.

    The last attempt's cluster is kept while it exists, is the run's, its head was never lost, its
    shape is what the spec makes now (an edited image, resources, replicas or secretEnv would otherwise
    be silently ignored, or leave the next driver waiting for workers the pods cannot hold), and it did
    not end the last ``KEPT_CLUSTER_INTERRUPTIONS`` attempts in a row by infrastructure faults;
    otherwise the next generation, and the old one deleted (a re-created head would start a
    new Ray cluster anyway, and its pods would hold capacity the new one waits for). A namesake's
    cluster (another TrainingRun of this name, being garbage-collected) is never deleted.
    """
    if not obs.ray_cluster_per_run:
        return None, None
    current = obs.state.current
    last = current.ray_cluster if current is not None else None
    if not last:
        return ray_cluster_name(obs.run.name, 1), None
    seen = obs.ray_cluster if obs.ray_cluster is not None and obs.ray_cluster.name == last else None
    ours = seen is not None and (obs.run_uid is None or seen.owner_uid == obs.run_uid)
    usable = seen is not None and ours and seen.head_lost is None and not _reshaped(obs, seen)
    if usable and not _interrupted_on(obs.state, last):
        return last, None
    following = ray_cluster_name(obs.run.name, ray_cluster_generation(last, obs.run.name) + 1)
    return following, (last if ours else None)


def _reshaped(obs: Observation, seen: RayClusterView) -> bool:
    """Whether the spec now makes a cluster of another shape than ``seen`` (one made before clusters carried
    their shape is taken as it is)."""
    return seen.shape is not None and obs.ray_cluster_shape is not None and seen.shape != obs.ray_cluster_shape


def _interrupted_on(state: RunState, ray_cluster: str) -> bool:
    """Whether the last ``KEPT_CLUSTER_INTERRUPTIONS`` attempts all ran on ``ray_cluster`` and ended
    Interrupted (infrastructure faults, nothing spent): the cluster itself may be what fails them
    (its nodes drained, a broken head: "Job supervisor actor could not be scheduled"), and waiting
    on it would stall the run for ever. A new one costs what every attempt of a run without a kept
    cluster pays; an outage elsewhere (S3) merely gets a new cluster for its next attempt."""
    last = state.attempts[-KEPT_CLUSTER_INTERRUPTIONS:]
    return (
        len(last) == KEPT_CLUSTER_INTERRUPTIONS
        and interruptions_in_a_row(last) == KEPT_CLUSTER_INTERRUPTIONS
        and all(attempt.ray_cluster == ray_cluster for attempt in last)
    )


def _why_not_kept(obs: Observation, old: str) -> str:
    seen = obs.ray_cluster
    if seen is None or seen.name != old:
        return "gone"
    if seen.head_lost:
        return f"its head was lost: {seen.head_lost}"
    if _reshaped(obs, seen):
        return "the run's spec now makes another (its image, resources, replicas or secretEnv changed)"
    if obs.run_uid is not None and seen.owner_uid != obs.run_uid:
        return "another TrainingRun's"
    return f"the last {KEPT_CLUSTER_INTERRUPTIONS} attempts on it ended by infrastructure faults"


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


def _plan_running_attempt(obs: Observation, current: AttemptStatus, now: datetime) -> Plan:  # noqa: PLR0911
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
        return _rayjob_gone(obs, current, now)
    if obs.run_uid is not None and job.owner_uid != obs.run_uid:
        return wait_for_foreign_rayjob(state, obs.run, current.ray_job, current.attempt, job.owner_uid)
    if job.deployment_status == DEPLOYMENT_VALIDATION_FAILED:
        return _validation_failed(obs, current, job, now)
    if not job.finished:
        return _plan_unfinished(obs, current, job, now)
    if obs.records is None and job.job_status != JOB_SUCCEEDED and not job.disruption:
        if not obs.storage_refused:
            return _wait_for_storage(obs, current, now)
        end = classify_end(job, AttemptRecords())
        end = replace(end, message=f"{end.message} ({_judged_without_records(obs)})")
    else:
        end = classify_end(job, obs.records or AttemptRecords())
    if end.outcome in (OUTCOME_FAILED, OUTCOME_INTERRUPTED) and job.end_time is not None:
        waited = (now - job.end_time).total_seconds()
        if waited < obs.settle_seconds:
            # A disruption that caused the failure may still be on its way from the pod watcher.
            return Plan(state, requeue_after_s=obs.settle_seconds - waited)
    return _released(end_attempt(state, obs.run, end, now), end, current)


def _plan_unfinished(obs: Observation, current: AttemptStatus, job: RayJobView, now: datetime) -> Plan:
    """The attempt's RayJob has not finished: it starts, runs, or its cluster's head was lost."""
    head_lost = _head_lost(obs, current)
    if head_lost is not None:
        # KubeRay would mark the RayJob Failed only after RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (300 s),
        # and a driver on the lost head is gone with it: the attempt ends now, as any lost node's does.
        end = AttemptEnd(OUTCOME_PREEMPTED, REASON_NODE_LOST, f"the Ray head was lost: {head_lost}")
        return _released(end_attempt(obs.state, obs.run, end, now), end, current)
    recorded_end = _recorded_end(obs, current, now)
    if recorded_end is not None:
        return recorded_end
    running = job.job_status == JOB_RUNNING
    if not running and _past_start_deadline(obs, current, now):
        return _start_deadline_exceeded(obs, current, job, now)
    message = f"attempt {current.attempt} {'running' if running else 'starting'}"
    return Plan(replace(obs.state, phase=RUNNING if running else PENDING, message=message))


def _recorded_end(obs: Observation, current: AttemptStatus, now: datetime) -> Plan | None:
    """The job recorded its attempt's end and its RayJob has not finished: wait ``RECORDED_END_EXIT_S``
    from the record for it, then end the attempt from the records and delete the RayJob. None when no
    record with a readable time was read (the reconcile reads them only once progress stalls)."""
    records = obs.records
    if records is None:
        return None
    times = [at for record in (records.outcome, records.preempted) if (at := _record_time(record)) is not None]
    end = _end_from_records(records)
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


def _released(decided: Plan, end: AttemptEnd, ended: AttemptStatus) -> Plan:
    """A preempted or interrupted attempt's RayJob is deleted as soon as its end is recorded, when the
    run goes on: KubeRay keeps a finished RayJob's cluster for its TTL (600 s) and replaces the pods
    the lost node took, so that cluster's head and new workers would hold, and race the next attempt
    for, the very capacity it waits for. A failed attempt's cluster stays for its TTL, for its logs.
    """
    goes_on = decided.state.phase not in TERMINAL_PHASES
    if goes_on and end.outcome in (OUTCOME_PREEMPTED, OUTCOME_INTERRUPTED):
        return replace(decided, delete_rayjob=ended.ray_job)
    return decided


def _rayjob_gone(obs: Observation, current: AttemptStatus, now: datetime, *, counted: bool = True) -> Plan:
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
    end = _end_from_records(obs.records or AttemptRecords())
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


def _end_from_records(records: AttemptRecords) -> AttemptEnd | None:
    """How the attempt ended by the job's own records alone, as they would say it with its RayJob
    finished; None when it recorded nothing."""
    if records.exit_code == EXIT_OK:
        return AttemptEnd(OUTCOME_SUCCEEDED, REASON_TRAINING_FINISHED, "the job finished")
    if records.outcome is None and records.preempted is None:
        return None
    return classify_end(RayJobView(JOB_FAILED, DEPLOYMENT_FAILED), records)


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
    new = replace(obs.state, message=message, storage_unreachable_since=timestamp(since))
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
    started = parse_timestamp(current.start_time)
    if not obs.start_deadline_seconds or started is None:
        return False
    return (now - started).total_seconds() > obs.start_deadline_seconds


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
    message = (
        f"the Ray cluster of attempt {current.attempt} did not start within {obs.start_deadline_seconds:.0f} s "
        f"(RayJob {current.ray_job}: {where}); `kubectl get events -n {obs.run.namespace}` tells why: pods "
        "refused by admission (Pod Security, a quota), an image that cannot be pulled, a Secret or key that "
        "spec.secretEnv names and the namespace lacks, or no node with capacity"
    )
    decided = end_attempt(obs.state, obs.run, AttemptEnd(OUTCOME_FAILED, REASON_START_DEADLINE_EXCEEDED, message), now)
    return replace(decided, delete_rayjob=current.ray_job)


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
                last_transition_time=unchanged or timestamp(now),
                reason=why,
                message=bounded(state.message) if true else "",
            )
        )
    return tuple(result)


def _storage_unreachable(state: RunState, now: datetime, patience_s: float) -> bool:
    since = parse_timestamp(state.storage_unreachable_since)
    return since is not None and (now - since).total_seconds() >= patience_s
