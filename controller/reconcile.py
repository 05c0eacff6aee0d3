"""One reconcile of one TrainingRun: observe, plan (spotray/decisions/run_plan.py), create, persist, delete.

Restart safety comes from deterministic names: the next attempt's number is always "the last one
in status.attempts + 1", and its RayJob is ``<run>-a<N>``. So the RayJob is created first (the
user waits for it) and the status written after: a controller killed in between finds the status
one attempt behind on restart, plans the same attempt N again, and its create answers 409; nothing
is duplicated. Deletions go the other way round: the status says "Suspended" before the RayJob is
deleted, and a suspended run's RayJob is deleted again at every reconcile until it is gone. A
recorded attempt whose RayJob vanished is judged from its records and never created again under
its number (spotray/decisions/running_attempt.py ``rayjob_gone``).
Reconciles triggered by a change read the TrainingRun fresh from the API server (not from a watch
cache that may lag its own last patch), under a per-run lock, so two triggers never interleave.
Events are posted from a background thread, each once (controller/kube_events.py): they are for people.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from spotray.contract.attempts import OUTCOME_RUNNING, AttemptId, AttemptRecords
from spotray.contract.errors import Cause, SpotrayError, cause_of
from spotray.contract.names import (
    ATTEMPT_LABEL,
    CLUSTER_SHAPE_ANNOTATION,
    DISRUPTED_AT_ANNOTATION,
    DISRUPTION_ANNOTATION,
    DRIVER_EXIT_MARGIN_S,
    FAILED,
    HEAD_LOST_ANNOTATION,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    RAY_CLUSTER_LABEL,
    RUN_LABEL,
    RUNNING,
    SPARE_MOVED_ANNOTATION,
    TERMINAL_PHASES,
    rayjob_name,
)
from spotray.contract.spec import (
    ON_DEMAND,
    SPOT,
    SPOT_THEN_ON_DEMAND,
    InvalidSpecError,
    TrainingRun,
    parse_training_run,
)
from spotray.contract.status import (
    AttemptStartup,
    AttemptStatus,
    IntervalLoss,
    RunStatus,
    format_date_time,
    parse_timestamp,
    unchecked_timestamp,
)
from spotray.contract.sweep import MAX_OBJECTIVE_STEPS, objective_steps
from spotray.controller import metrics
from spotray.controller.checkpoint_key_secret import build_checkpoint_key_secret, new_checkpoint_key
from spotray.controller.config import ControllerConfig
from spotray.controller.disruptions import disruption_note, disruption_time, node_loss_note, scheduled_nodes
from spotray.controller.kube import Cluster, RayJobRefusedError
from spotray.controller.kube_events import EventPoster
from spotray.controller.network_policy import build_run_network_policy
from spotray.controller.ownership import foreign_object_refusal
from spotray.controller.pod_waits import pods_waiting
from spotray.controller.rayjob import (
    WORKER_GROUP,
    build_ray_cluster,
    build_rayjob,
    keeps_ray_cluster,
    queue_refusal,
    ray_cluster_shape,
    secret_env_refusal,
    size_refusal,
)
from spotray.controller.run_store import (
    StoreReport,
    StoreReports,
    file_access_refusal,
    open_run_store,
    s3_access_refusal,
)
from spotray.controller.spare_placement import SpareMoved, spare_to_move, worker_pods
from spotray.controller.startup import attempt_startup, pods_ready_at
from spotray.decisions.attempt_end import rayjob_refused
from spotray.decisions.conditions import conditions
from spotray.decisions.cost import Prices, run_cost
from spotray.decisions.observation import STALLED_PROGRESS_S, Observation, PodsWaiting, RayClusterView, RayJobView
from spotray.decisions.run_plan import plan
from spotray.decisions.run_state import OUTCOME_UNKNOWN, Plan, RunState
from spotray.decisions.running_attempt import wait_for_foreign_rayjob
from spotray.decisions.vocabulary import (
    REASON_INVALID_SPEC,
    REASON_RAYJOB_REFUSED,
    REASON_SPARE_MOVED,
    REASON_STATUS_UNREADABLE,
    Event,
    RayJobRefusal,
    bounded,
)
from spotray.train.records.attempt_records import read_attempt_records
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass
class ProcessMemory:
    """What this controller process keeps between reconciles. None of it is a fact a decision rests on,
    so a restart that loses it costs reads and writes, never correctness: each is rebuilt from the cluster.

    - ``locks``: one per run, so a run is reconciled on one thread at a time (the work queue's threads);
    - ``events``: the Events posted, so none is posted twice in a row (controller/kube_events.py);
    - ``reports``: what the store said about each attempt, read again only when it may have changed;
    - ``created_awaiting_status``: run UID -> the attempt whose RayJob a reconcile created while leaving
      the status write to the next (``defer_status``);
    - ``secrets_seen``: (namespace, Secret) -> when it was last allowed (``SECRET_SEEN_TTL_S``).
    """

    locks: defaultdict[str, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))
    locks_guard: threading.Lock = field(default_factory=threading.Lock)
    events: EventPoster = field(default_factory=EventPoster)
    reports: StoreReports = field(default_factory=StoreReports)
    created_awaiting_status: dict[str, int] = field(default_factory=dict)
    secrets_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        with self.locks_guard:
            return self.locks[f"{namespace}/{name}"]


# This process's: the kopf handlers are module-level functions, and so is what they share.
MEMORY = ProcessMemory()


def crash_point(name: str) -> None:
    """Die here if SPOTRAY_CRASH_AT names this point: how the e2e tests kill the controller mid-reconcile.

    A SIGKILL from outside cannot hit the window between creating the RayJob and writing the status
    on demand; this can. Unset (always, outside tests) it does nothing.
    """
    if os.environ.get("SPOTRAY_CRASH_AT") == name:
        log.error("SPOTRAY_CRASH_AT=%s: exiting now, as a crash would", name)
        os._exit(70)


def controller_owner_uid(body: dict[str, Any]) -> str | None:
    """The UID of the object's controller owner (a TrainingRun for ours); None when it has none."""
    references = (body.get("metadata") or {}).get("ownerReferences") or []
    return next((ref.get("uid") for ref in references if ref.get("controller")), None)


def rayjob_view(job: dict[str, Any] | None) -> RayJobView | None:
    if job is None:
        return None
    status = job.get("status") or {}
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return RayJobView(
        job_status=status.get("jobStatus") or None,
        deployment_status=status.get("jobDeploymentStatus") or None,
        message=status.get("message") or "",
        end_time=unchecked_timestamp(status.get("endTime")),
        disruption=annotations.get(DISRUPTION_ANNOTATION),
        disrupted_at=unchecked_timestamp(annotations.get(DISRUPTED_AT_ANNOTATION)),
        owner_uid=controller_owner_uid(job),
        suspended=(job.get("spec") or {}).get("suspend") is True,
    )


def ray_cluster_view(body: dict[str, Any] | None) -> RayClusterView | None:
    if body is None:
        return None
    meta = body.get("metadata") or {}
    return RayClusterView(
        name=str(meta.get("name") or ""),
        head_lost=(meta.get("annotations") or {}).get(HEAD_LOST_ANNOTATION),
        owner_uid=controller_owner_uid(body),
        spare_moved=(meta.get("annotations") or {}).get(SPARE_MOVED_ANNOTATION),
        shape=(meta.get("annotations") or {}).get(CLUSTER_SHAPE_ANNOTATION),
    )


def attempt_pod_labels(run_name: str, attempt: AttemptStatus) -> dict[str, str]:
    """The labels that select an attempt's pods: its own, or those of the run's cluster it ran on."""
    if attempt.ray_cluster:
        return {RUN_LABEL: run_name, RAY_CLUSTER_LABEL: attempt.ray_cluster}
    return {RUN_LABEL: run_name, ATTEMPT_LABEL: str(attempt.attempt)}


def _refuse_invalid(cluster: Cluster, body: dict[str, Any], error: InvalidSpecError, now: datetime) -> None:
    stored = RunStatus.of(body)
    if stored.phase == FAILED:
        return  # refused once already; a fix is a new generation, which we would parse fine
    message = "the spec is not valid: " + "; ".join(error.problems)
    state = RunState(phase=FAILED, message=message, failure_reason=REASON_INVALID_SPEC)
    meta = body["metadata"]
    refused = RunStatus(
        phase=FAILED,
        message=message,
        observed_generation=meta.get("generation"),
        conditions=conditions(state, stored.conditions or (), meta.get("generation", 0), now),
    )
    # Only these fields: the attempts and budgets stay as they were. Into this object only (not a
    # run of the same name created since: it is reconciled on its own).
    if cluster.patch_run_status(meta["namespace"], meta["name"], refused.to_status(), meta.get("resourceVersion")):
        cluster.post_event(body, Event("Warning", REASON_INVALID_SPEC, message), now)


def settled(status: RunStatus | RunState) -> bool:
    """A finished run with nothing owed: its last progress and checkpoint were read (see ``_status``);
    from the stored status (the watch) or the lifecycle's state of it (reconcile)."""
    return status.phase in TERMINAL_PHASES and status.storage_unreachable_since is None


def _report(
    run_store: Callable[[], ObjectStore],
    run: TrainingRun,
    state: RunState,
    run_uid: str,
    *,
    ended: bool,
    objective_steps: Sequence[int] | None = None,
) -> tuple[StoreReport | None, str]:
    """(what S3 says about the current attempt, ""), or (None, why) when it cannot be read: a read
    failure goes into the message, not an error."""
    current = state.current
    if current is None:
        return None, ""
    requested = {
        entry.attempt: moment.timestamp() for entry in state.attempts if (moment := parse_timestamp(entry.start_time))
    }
    ended_at = parse_timestamp(current.end_time)
    try:
        found = MEMORY.reports.read(
            run_store(),
            AttemptId(run_uid, current.attempt),
            ended=ended,
            requested=requested,
            ended_at=ended_at.timestamp() if ended_at else None,
            objective_steps=objective_steps,
            every_steps=run.spec.checkpoint.fixed_every_steps,
        )
    except (SpotrayError, OSError, ValueError) as error:
        log.warning("cannot read %s for %s/%s: %s", run.spec.checkpoint.uri, run.namespace, run.name, error)
        return None, str(error)
    return found, ""


def _records(
    run_store: Callable[[], ObjectStore], run: TrainingRun, attempt: AttemptId
) -> tuple[AttemptRecords | None, str, Cause | None]:
    """(the attempt's records, "", None) or (None, why, whose it is to fix) when the store cannot be
    read: unknown, not empty."""
    try:
        return read_attempt_records(run_store(), attempt), "", None
    except (SpotrayError, OSError, ValueError) as error:
        log.warning("cannot read the records of %s/%s %s: %s", run.namespace, run.name, attempt, error)
        return None, str(error), cause_of(error)


# Past the workers' grace period, how long a suspended attempt's RayJob waits for its driver to record the
# emergency checkpoint and end (spotray/decisions/run_plan.py ``_suspend_checkpoint_left``), as the driver's
# own bound after a notice does.
SUSPEND_CHECKPOINT_MARGIN_S = float(DRIVER_EXIT_MARGIN_S)
SECRET_SEEN_TTL_S = 60.0  # how long an allowed Secret is taken as allowed (ProcessMemory.secrets_seen)


def _s3_refusal(cluster: Cluster, run: TrainingRun, config: ControllerConfig) -> tuple[str, str] | None:
    """(reason, message) when the run's Secret is missing or may not be used (controller/s3_access.py).

    An allowed Secret is remembered for a minute (many runs share one), a refusal never, so a
    Secret created or labelled to fix a waiting run is seen at once.
    """
    name = run.spec.checkpoint.secret_ref or config.s3_secret
    if name is None:
        return None
    key = (run.namespace, name)
    if time.monotonic() - MEMORY.secrets_seen.get(key, -SECRET_SEEN_TTL_S) < SECRET_SEEN_TTL_S:
        return None
    refused = s3_access_refusal(run, cluster.read_secret(run.namespace, name), config)
    if refused is None:
        MEMORY.secrets_seen[key] = time.monotonic()
    return refused


def reconcile(
    cluster: Cluster,
    config: ControllerConfig,
    namespace: str,
    name: str,
    body: dict[str, Any] | None = None,
    *,
    defer_status: bool = False,
) -> float | None:
    """Bring one TrainingRun one step closer to done; returns seconds until it wants another look.

    ``body``: the object as just created (kopf's create event), which saves a read on the hot path.
    ``defer_status``: other runs wait for their RayJob (a burst): create this run's RayJob now and
    leave its status write and Events to a second reconcile, asked for by returning 0 (see ``_act``).
    """
    started = time.perf_counter()
    with MEMORY.lock_for(namespace, name):
        try:
            return _reconcile_locked(cluster, config, namespace, name, body, defer_status)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile_locked(  # noqa: PLR0917
    cluster: Cluster,
    config: ControllerConfig,
    namespace: str,
    name: str,
    body: dict[str, Any] | None,
    defer_status: bool,
) -> float | None:
    body = body if body is not None else cluster.get_run(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        metrics.forget_run(namespace, name)
        return None
    now = datetime.now(UTC)
    try:
        run = parse_training_run(body, where=f"TrainingRun {namespace}/{name}")
    except InvalidSpecError as error:
        _refuse_invalid(cluster, body, error, now)
        metrics.set_phase(namespace, name, FAILED)
        return None
    refused_directory = file_access_refusal(run, config)
    if refused_directory is not None:
        # The controller could never read this run's records: it would judge its attempts blind or
        # wait for ever. Bad input, at once (_refuse_invalid does nothing to a run already Failed).
        fix = "use an s3:// URI, or ask the operator to list its directory in the chart's controller.fileRoots"
        _refuse_invalid(cluster, body, InvalidSpecError([f"spec.checkpoint.uri: {refused_directory}; {fix}"]), now)
        metrics.set_phase(namespace, name, FAILED)
        return None
    # Never raises: what the status holds unreadably is unknown, and the plan reports and rebuilds it.
    state = RunState.from_status(_stored_status(body), run.name)
    if settled(state) and not state.unreadable:
        metrics.observe_run(
            namespace, name, metrics.RunFigures.of(RunStatus.from_status(_stored_status(body)), state.phase)
        )
        return None  # finished runs keep their last status; nothing to read or write
    if state.history_lost:
        # status.attempts lost entries: the run's own RayJobs say which attempt is the latest, so
        # none is started again or beside it.
        state = state.with_attempts_seen(_attempts_of(cluster, run, body["metadata"]["uid"]), run.name)
    # Opened at most once per reconcile, and only when something needs S3.
    run_store = functools.cache(functools.partial(open_run_store, run, cluster, config))

    # Observe: every fact the decision needs, an unreadable one marked unknown.
    progress = _stored_status(body).get("progress")
    progress_at = unchecked_timestamp(progress.get("updateTime")) if isinstance(progress, dict) else None
    observation = _observe(cluster, config, run, body["metadata"]["uid"], state, run_store, now, progress_at)
    # Decide: a pure function of the facts (spotray/decisions/run_plan.py).
    decided = plan(observation, now)
    if decided.create_attempt is not None:
        decided = _hold_without_credentials(cluster, config, run, state, decided)
    # Act: create, persist, delete (see the module docstring).
    return _act(
        cluster,
        config,
        run,
        body,
        state,
        decided,
        run_store,
        now,
        job=observation.job,
        ray_cluster=observation.ray_cluster,
        defer_status=defer_status,
    )


def _stored_status(body: dict[str, Any]) -> dict[str, Any]:
    status = body.get("status")
    return status if isinstance(status, dict) else {}


def _attempts_of(cluster: Cluster, run: TrainingRun, run_uid: str) -> list[int]:
    """The attempts the run's own RayJobs (its UID the owner) are for, by their attempt label."""
    numbers = []
    for job in cluster.list_rayjobs(run.namespace, {RUN_LABEL: run.name}):
        label = str(((job.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL, ""))
        view = rayjob_view(job)
        if view is not None and view.owner_uid == run_uid and label.isdigit():
            numbers.append(int(label))
    return numbers


def _observe(  # noqa: PLR0917 - the facts' sources, each named
    cluster: Cluster,
    config: ControllerConfig,
    run: TrainingRun,
    run_uid: str,
    state: RunState,
    run_store: Callable[[], ObjectStore],
    now: datetime,
    progress_at: datetime | None = None,
) -> Observation:
    """``progress_at``: the status's last progress (``progress.updateTime``); None when there is none."""
    current = state.current
    job = rayjob_view(cluster.get_rayjob(run.namespace, current.ray_job)) if current is not None else None
    ray_cluster = None
    per_run = keeps_ray_cluster(run, config)
    if per_run and current is not None and current.ray_cluster:
        ray_cluster = ray_cluster_view(cluster.get_ray_cluster(run.namespace, current.ray_cluster))
    records: AttemptRecords | None = AttemptRecords()
    storage_error, refused = "", False
    ended = job is not None and job.finished and job.job_status != JOB_SUCCEEDED and job.owner_uid == run_uid
    # A RayJob created and then gone: its attempt is judged from its records
    # (spotray/decisions/running_attempt.py rayjob_gone).
    gone = (
        job is None
        and current is not None
        and current.outcome in (OUTCOME_RUNNING, OUTCOME_UNKNOWN)
        and current.reason != REASON_RAYJOB_REFUSED
    )
    settled = job is not None and (
        job.end_time is None or (now - job.end_time).total_seconds() >= config.settle_seconds
    )
    if job is not None and current is not None and ended and settled and not job.disruption:
        # The pod watch sees a node lost only while the controller runs (its report has had the
        # settle time to arrive); one lost while it was down is read back from what remains
        # (controller/kube.py: pods, Scheduled events, Nodes).
        lost = _node_loss_read_back(cluster, run, current, read_nodes=config.read_nodes)
        if lost is not None:
            job = replace(job, disruption=lost)
    # A running job whose progress stopped may have recorded its end and not exited: its records are read
    # too (spotray/decisions/running_attempt.py RECORDED_END_EXIT_S). Only then: a training job costs no reads here.
    stalled = (
        job is not None
        and not job.finished
        and job.job_status == JOB_RUNNING
        and job.owner_uid == run_uid
        and (progress_at is None or (now - progress_at).total_seconds() >= STALLED_PROGRESS_S)
    )
    starting = job is not None and not job.finished and job.job_status != JOB_RUNNING and job.owner_uid == run_uid
    pods_waiting = _pods_waiting(cluster, run, current) if current is not None and starting else None
    if current is not None and (ended or gone or stalled):
        records, storage_error, cause = _records(run_store, run, AttemptId(run_uid, current.attempt))
        # No Secret: the controller reads unsigned (never with its own identity, run_store.py), so a
        # bucket that answered "no" will answer "no" for ever; waiting for it would be no bound.
        no_secret = (run.spec.checkpoint.secret_ref or config.s3_secret) is None
        refused = records is None and no_secret and cause == Cause.BAD_INPUT
    return Observation(
        run,
        state,
        job,
        records,
        run_uid=run_uid,
        storage_error=storage_error,
        storage_refused=refused,
        settle_seconds=config.settle_seconds,
        start_deadline_seconds=config.start_deadline_seconds,
        pods_waiting=pods_waiting,
        storage_patience_seconds=config.storage_patience_seconds,
        ray_cluster_per_run=per_run,
        ray_cluster=ray_cluster,
        ray_cluster_shapes={c: ray_cluster_shape(run, config, c) for c in _capacities(run)} if ray_cluster else {},
        suspend_checkpoint_seconds=config.worker_grace_seconds + SUSPEND_CHECKPOINT_MARGIN_S,
    )


def _capacities(run: TrainingRun) -> tuple[str, ...]:
    """Where the run's next attempt may run its workers: both pools only for spot-then-on-demand (each
    shape is a cluster spec built and hashed on every reconcile of a kept cluster)."""
    policy = run.spec.workers.capacity_policy
    return (SPOT, ON_DEMAND) if policy == SPOT_THEN_ON_DEMAND else (policy,)


def _pods_waiting(cluster: Cluster, run: TrainingRun, attempt: AttemptStatus) -> PodsWaiting:
    """What the starting attempt's pods wait for (one LIST); unreadable when they cannot be listed,
    which never ends the attempt (spotray/decisions/running_attempt.py)."""
    try:
        return pods_waiting(cluster.list_attempt_pods(run.namespace, attempt_pod_labels(run.name, attempt)))
    except (ApiException, OSError) as error:
        return PodsWaiting(unreadable=str(getattr(error, "reason", None) or error))


def _node_loss_read_back(cluster: Cluster, run: TrainingRun, attempt: AttemptStatus, *, read_nodes: bool) -> str | None:
    """A node of the attempt's pods lost while nobody watched, read back; None when none was, or
    when it cannot be read (then the attempt is judged as before, from the pod watch's facts).
    Without ``read_nodes`` only the pods still there are read (a namespaced install's default).

    On a run's cluster kept across attempts (``attempt.ray_cluster``) only what happened since the
    attempt began counts: a disruption before it, or a pod placed before it on a node gone since, may
    be an earlier attempt's. So a kept worker lost while the controller was down and gone before it
    came back is not seen here (the attempt is judged from its records and the RayJob).
    """
    since = parse_timestamp(attempt.start_time) if attempt.ray_cluster else None
    try:
        pods = cluster.list_attempt_pods(run.namespace, attempt_pod_labels(run.name, attempt))
        for pod in pods:
            note = disruption_note(pod)
            disrupted_at = unchecked_timestamp(disruption_time(pod))
            if note is not None and (since is None or (disrupted_at is not None and disrupted_at >= since)):
                return note
        if not read_nodes:
            return None
        prefix = attempt.ray_cluster or attempt.ray_job
        placed = scheduled_nodes(pods, cluster.list_scheduled_events(run.namespace), prefix)
        if since is not None:
            placed = {node: (pod, at) for node, (pod, at) in placed.items() if at is not None and at >= since}
        return node_loss_note(placed, {node: cluster.node_created(node) for node in placed})
    except (ApiException, OSError) as error:  # a namespaced install may not read Nodes (rbac.readNodes)
        why = getattr(error, "reason", error)
        log.warning("cannot read back the nodes of %s/%s: %s", run.namespace, attempt.ray_job, why)
        return None


def _hold_without_credentials(
    cluster: Cluster, config: ControllerConfig, run: TrainingRun, state: RunState, decided: Plan
) -> Plan:
    """A plan that starts an attempt, unless the run may not use its Secret: then wait, spending nothing.

    The Secret is looked at only here, when an attempt is about to start, not on every reconcile.
    """
    refused = _s3_refusal(cluster, run, config)
    if refused is None:
        return decided
    reason, refusal = refused
    events = (Event("Warning", reason, refusal),) if state.message != refusal else ()
    # A status the plan found unreadable is still said so (the state written is the one read).
    reported = tuple(event for event in decided.events if event.reason == REASON_STATUS_UNREADABLE)
    return Plan(
        replace(state, message=refusal), events=(*reported, *events), requeue_after_s=config.reconcile_interval_seconds
    )


def _act(  # noqa: PLR0917
    cluster: Cluster,
    config: ControllerConfig,
    run: TrainingRun,
    body: dict[str, Any],
    state: RunState,
    decided: Plan,
    run_store: Callable[[], ObjectStore],
    now: datetime,
    *,
    job: RayJobView | None,
    ray_cluster: RayClusterView | None = None,
    defer_status: bool,
) -> float | None:
    namespace, name, uid = run.namespace, run.name, body["metadata"]["uid"]
    unrecorded = MEMORY.created_awaiting_status.get(uid)
    if unrecorded is not None and decided.create_attempt != unrecorded:
        # The plan changed before the deferred status write (the run was suspended, its Secret
        # withdrawn): the RayJob that reconcile created was never recorded, so nothing would ever
        # end it. Delete it; the run's checkpoints are untouched.
        del MEMORY.created_awaiting_status[uid]
        cluster.delete_rayjob(namespace, rayjob_name(name, unrecorded))
    if decided.create_attempt is not None:
        created = _create_attempt(cluster, config, run, uid, state, decided, now, defer_status=defer_status)
        if created is None:
            return 0.0  # the status write is deferred: come back once no new run waits
        decided = created
    status = _stored_status(body)
    new_status, found = _status(
        run,
        run_store,
        uid,
        state=decided.state,
        previous=RunStatus.from_status(status),
        objective_steps=objective_steps(body["metadata"].get("annotations") or {}),
        generation=body["metadata"].get("generation", 0),
        now=now,
        job=job if decided.create_attempt is None else None,  # a new attempt has no progress yet
        storage_patience_s=config.storage_patience_seconds,
        prices=config.prices,
        attempt_pods=lambda attempt: cluster.list_attempt_pods(namespace, attempt_pod_labels(name, attempt)),
    )
    for key in state.unreadable_keys:
        # Held unreadably and not written anew (progress while S3 is not read): removed, so
        # nothing unreadable stays to be reported; the next read of the store fills it again.
        new_status.setdefault(key, None)
    if status_changed(status, new_status) and not cluster.patch_run_status(
        namespace, name, new_status, body["metadata"].get("resourceVersion")
    ):
        # Changed since it was read: edited, or deleted and created again. Nothing decided on the old
        # object is done (its deletes would take the new one's RayJob of the same name): decide again.
        log.info("%s/%s changed while reconciled: its status is not written, it is reconciled again", namespace, name)
        return 0.0
    if decided.delete_rayjob:
        cluster.delete_rayjob(namespace, decided.delete_rayjob)
    if decided.delete_ray_cluster:
        cluster.delete_ray_cluster(namespace, decided.delete_ray_cluster)
    _move_idle_spare(cluster, config, run, body, now, decided=decided, ray_cluster=ray_cluster, found=found)
    for event in decided.events:
        if MEMORY.events.post(cluster.post_event, body, event, now):
            log.info("%s/%s: %s: %s", namespace, name, event.reason, event.message)
    for attempt in decided.state.attempts:
        if attempt not in state.attempts and attempt.end_time:
            metrics.ATTEMPT_OUTCOMES.labels(outcome=attempt.outcome).inc()
    written = {key: value for key, value in {**status, **new_status}.items() if value is not None}
    metrics.observe_run(namespace, name, metrics.RunFigures.of(RunStatus.from_status(written), decided.state.phase))
    if decided.state.phase in TERMINAL_PHASES and new_status.get("storageUnreachableSince"):
        return config.reconcile_interval_seconds  # its last report is owed (_status): read again
    return decided.requeue_after_s


def status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether merge-patching ``new`` onto ``old`` would change anything (a null removes a field).

    Most periodic refreshes change nothing; skipping their patch spares the API server a write and
    the controller the watch event that the write would send back to it.
    """
    return any(old.get(key) != value for key, value in new.items())


def _create_attempt(  # noqa: PLR0917
    cluster: Cluster,
    config: ControllerConfig,
    run: TrainingRun,
    uid: str,
    state: RunState,
    decided: Plan,
    now: datetime,
    *,
    defer_status: bool,
) -> Plan | None:
    """Create the planned attempt's RayJob; the plan to carry out, or None when the rest is deferred.

    A RayJob the API server refuses (or that is too large to ask for) leaves the attempt recorded
    without one, and the plan says why (``rayjob_refused``).
    """
    attempt = decided.create_attempt
    assert attempt is not None
    if MEMORY.created_awaiting_status.get(uid) == attempt:
        # Created by the reconcile that deferred this status write: no second create (a 409 costs
        # the API server as much as a create). Used once: a RayJob deleted since is made again.
        del MEMORY.created_awaiting_status[uid]
        return decided
    assert decided.state.current is not None
    ray_cluster, capacity = decided.state.current.ray_cluster, decided.state.current.capacity
    body = build_rayjob(run, attempt, uid, config, ray_cluster=ray_cluster, capacity=capacity)
    try:
        existing = _create(cluster, run, uid, config, body, attempt=attempt, ray_cluster=ray_cluster, capacity=capacity)
    except RayJobRefusedError as error:
        log.warning("%s/%s: RayJob %s not created: %s", run.namespace, run.name, body["metadata"]["name"], error)
        return rayjob_refused(decided, run, error.refusal, now, config.start_deadline_seconds)
    if existing is None:
        metrics.ATTEMPTS_STARTED.inc()
        crash_point("rayjob-created")
        if defer_status:
            # New attempts first: under a burst the API server is the bottleneck, and this run's
            # status patch and Event would delay the next runs' RayJobs. A crash before the deferred
            # write is the restart case of the module docstring (same attempt, the create answers 409).
            MEMORY.created_awaiting_status[uid] = attempt
            return None
        return decided
    owner = controller_owner_uid(existing)
    if owner != uid:
        # Another run's RayJob with this attempt's name: adopt nothing, record nothing, wait.
        return wait_for_foreign_rayjob(state, run, existing["metadata"]["name"], attempt, owner)
    crash_point("rayjob-created")
    return decided


def _create(
    cluster: Cluster,
    run: TrainingRun,
    uid: str,
    config: ControllerConfig,
    body: dict[str, Any],
    *,
    attempt: int,
    ray_cluster: str | None = None,
    capacity: str | None = None,
) -> dict[str, Any] | None:
    """``cluster.create_rayjob``, after the controller's own checks (a run this controller's Ray clusters
    cannot serve, and the size check that the API server's store would make anyway) and, when they are
    on, the run's NetworkPolicy (its pods never start unprotected: controller/network_policy.py),
    for its first attempt, its checkpoint key (controller/checkpoint_key_secret.py) and, with a cluster per
    run, the run's RayCluster ``ray_cluster`` that the RayJob names."""
    refused = secret_env_refusal(run, config) or queue_refusal(run, config) or size_refusal(body)
    if refused is not None:
        raise RayJobRefusedError(refused)
    if config.run_network_policy:
        policy = build_run_network_policy(run, uid, config)
        _refuse_if_foreign("NetworkPolicy", policy, run, uid, cluster.create_network_policy(policy))
    if config.run_checkpoint_keys and not config.ray_cluster_selector and attempt == 1:
        cluster.create_checkpoint_key_secret(build_checkpoint_key_secret(run, new_checkpoint_key()))
    if ray_cluster is not None:
        # The run's cluster before its RayJob (which waits for it, Initializing, until it is Ready);
        # an attempt on a kept one finds it there (409, its owner ours).
        made = build_ray_cluster(run, ray_cluster, uid, config, capacity)
        if (refused := size_refusal(made)) is not None:
            raise RayJobRefusedError(refused)
        existing = cluster.create_ray_cluster(made)
        owners = None if existing is None else [controller_owner_uid(existing) or ""]
        _refuse_if_foreign("RayCluster", made, run, uid, owners)
    return cluster.create_rayjob(body)


def _refuse_if_foreign(kind: str, made: dict[str, Any], run: TrainingRun, uid: str, owners: list[str] | None) -> None:
    """The RayJob waits (``RayJobRefusedError``) while an object of the name the controller makes for the
    run is another's: a deleted namesake's that the garbage collector would remove under the new run."""
    foreign = None if owners is None else foreign_object_refusal(kind, made["metadata"]["name"], run, uid, owners)
    if foreign is not None:
        raise RayJobRefusedError(RayJobRefusal(code=409, reason="AlreadyExists", message=foreign))


def _status(
    run: TrainingRun,
    run_store: Callable[[], ObjectStore],
    run_uid: str,
    *,
    state: RunState,
    previous: RunStatus,
    objective_steps: Sequence[int] | None,
    generation: int,
    now: datetime,
    job: RayJobView | None,
    storage_patience_s: float,
    prices: Prices | None,
    attempt_pods: Callable[[AttemptStatus], list[dict[str, Any]]],
) -> tuple[dict[str, Any], StoreReport | None]:
    """The whole new status as a merge patch: the lifecycle's state, conditions, and what S3 says about
    progress (also returned: None when not read); ``attempt_pods`` lists an attempt's pods (read once
    per attempt, for its start-up)."""
    status = replace(
        state.run_status(),
        observed_generation=generation,
        conditions=conditions(state, previous.conditions or (), generation, now, storage_patience_s),
    )
    # Progress and checkpoints can only have moved once the attempt's job was handed to Ray: until
    # then (a Ray cluster waiting for nodes: most runs on a busy cluster) S3 is not read, and the
    # fields keep their last value (the status is merge-patched, and to_patch leaves out what is None).
    # A finished run is read again while its last report is owed (below), its RayJob gone or not.
    finished = state.phase in TERMINAL_PHASES
    owed = finished and state.storage_unreachable_since is not None
    if not owed and (job is None or not job.submitted):
        return status.to_patch(), None
    ended = finished or (job is not None and job.finished)
    found, storage_error = _report(run_store, run, state, run_uid, ended=ended, objective_steps=objective_steps)
    if finished:
        # The run ended while S3 could not be read (the RayJob said so): its last progress and
        # checkpoint are owed, and reconcile comes back for them until S3 answers.
        since = (state.storage_unreachable_since or format_date_time(now)) if storage_error else None
        status = replace(status, storage_unreachable_since=since)
    if found is not None:
        status = replace(
            status,
            progress=found.progress,
            last_checkpoint=found.last_checkpoint,
            goodput=found.goodput,
            checkpoint_interval=found.checkpoint_interval,
            interval_losses=merged_interval_losses(previous.interval_losses, found.interval_losses, found.resumed_from),
        )
        if prices is not None and found.goodput is not None:
            cost = run_cost(found.goodput, run.spec.workers, prices, state.attempts, now)
            status = replace(status, cost=cost)
        if status.attempts:
            *earlier, current = status.attempts
            if found.resumed_from is not None:
                current = replace(current, resumed_from=found.resumed_from)
            if found.skipped_checkpoints:
                current = replace(current, skipped_checkpoints=found.skipped_checkpoints)
            if found.resume_read is not None:
                current = replace(current, resume_read=found.resume_read)
            unrecorded = current.start_time and (current.startup is None or current.startup.first_step is None)
            if found.first_step_at is not None and unrecorded:
                # Once per attempt, when its first step is known: by then its pods were Ready. (An entry
                # without a start time, rebuilt from an old status, has none to measure from.)
                current = replace(current, startup=_startup(run, current, found, attempt_pods))
            status = replace(status, attempts=(*earlier, current))
    if found is not None and found.skipped_checkpoints and status.attempts and not finished:
        status = replace(status, message=bounded((status.message or "") + passed_over(status.attempts[-1])))
    if storage_error:
        status = replace(status, message=bounded(f"{status.message} (cannot read checkpoints: {storage_error})"))
    return status.to_patch(), found


def passed_over(current: AttemptStatus) -> str:
    """For status.message (``kubectl get``): the newer checkpoints the attempt did not resume from, and why."""
    skipped = current.skipped_checkpoints or ()
    if not skipped:
        return ""
    start = f"checkpoint-{current.resumed_from}" if current.resumed_from is not None else "step 0"
    more = f"; and {len(skipped) - 1} more (spotray status)" if len(skipped) > 1 else ""
    return f" (resumed from {start}, passing over {skipped[0]}{more})"


def _move_idle_spare(
    cluster: Cluster,
    config: ControllerConfig,
    run: TrainingRun,
    body: dict[str, Any],
    now: datetime,
    *,
    decided: Plan,
    ray_cluster: RayClusterView | None,
    found: StoreReport | None,
) -> None:
    """Move an idle spare off the node it shares with a training worker (controller/spare_placement.py).

    Only a running run with spares on its own RayCluster (``ray_cluster``, kept), whose rank 0 recorded
    which worker pods are idle (``found``: this reconcile's read of its progress). The move is
    annotated on the RayCluster first, so that a failure after it waits out the backoff instead of
    trying again at once; then KubeRay is asked to delete the pod and make a new one.
    """
    wanted = (
        config.move_idle_spares
        and run.spec.workers.spare_replicas > 0
        and decided.state.phase == RUNNING
        and not decided.delete_ray_cluster
    )
    hosts = found.worker_hosts if found is not None else None
    # Only the run's own cluster (never a namesake's), and not one whose head was lost.
    if (
        not wanted
        or hosts is None
        or ray_cluster is None
        or ray_cluster.head_lost
        or ray_cluster.owner_uid != body["metadata"]["uid"]
    ):
        return
    labels = {RUN_LABEL: run.name, RAY_CLUSTER_LABEL: ray_cluster.name}
    try:
        pods = worker_pods(cluster.list_attempt_pods(run.namespace, labels))
    except (ApiException, OSError) as error:
        why = getattr(error, "reason", error)
        log.warning("cannot read the pods of %s/%s: %s", run.namespace, ray_cluster.name, why)
        return
    last = SpareMoved.from_annotation(ray_cluster.spare_moved)
    move = spare_to_move(pods, hosts, last, now)
    if move is None:
        return
    try:
        cluster.annotate_ray_cluster(run.namespace, ray_cluster.name, {SPARE_MOVED_ANNOTATION: move.to_annotation()})
        cluster.delete_ray_cluster_worker(run.namespace, ray_cluster.name, WORKER_GROUP, move.pod)
    except (ApiException, OSError) as error:  # a placement is advice: the run goes on, the backoff holds
        why = getattr(error, "reason", error)
        log.warning("cannot move spare pod %s of %s/%s: %s", move.pod, run.namespace, ray_cluster.name, why)
        return
    message = (
        f"idle spare pod {move.pod} moved off node {move.node}, which it shared with training worker pod "
        f"{move.beside}: KubeRay makes a new spare, placed on another node if one has room (try {move.tries})"
    )
    if MEMORY.events.post(cluster.post_event, body, Event("Normal", REASON_SPARE_MOVED, message), now):
        log.info("%s/%s: %s: %s", run.namespace, run.name, REASON_SPARE_MOVED, message)


def _startup(
    run: TrainingRun,
    attempt: AttemptStatus,
    found: StoreReport,
    attempt_pods: Callable[[AttemptStatus], list[dict[str, Any]]],
) -> AttemptStartup | None:
    """The attempt's start-up milestones (controller/startup.py); without podsReady when its pods cannot be read."""
    try:
        ready = pods_ready_at(attempt_pods(attempt))
    except (ApiException, OSError) as error:
        why = getattr(error, "reason", error)
        log.warning("cannot read the pods of %s/%s: %s", run.namespace, attempt.ray_job, why)
        ready = None
    return attempt_startup(
        attempt.start_time, pods_ready=ready, training_loop_at=found.training_loop_at, first_step_at=found.first_step_at
    )


def merged_interval_losses(
    stored: Sequence[IntervalLoss] | None, found: Sequence[IntervalLoss], resumed_from: int | None = None
) -> tuple[IntervalLoss, ...] | None:
    """status.intervalLosses: the stored entries with this attempt's added (a step trained again, after a
    checkpoint was lost, takes its newest value); None (keep what is stored) when there is nothing new.

    An attempt that resumed from step ``resumed_from`` abandoned every step after it: their stored entries
    go (a run that went on from another run's checkpoint, population-based training's exploit, or an older
    checkpoint after the newest was lost), so nothing judges it by a life it no longer has."""
    kept = [entry for entry in stored or () if resumed_from is None or (entry.step or 0) <= resumed_from]
    if not found and len(kept) == len(stored or ()):
        return None
    by_step = {entry.step: entry for entry in kept} | {entry.step: entry for entry in found}
    merged = tuple(by_step[step] for step in sorted(by_step, key=lambda step: step or 0))
    return merged[-MAX_OBJECTIVE_STEPS:]
