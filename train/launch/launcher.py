"""The Ray Train driver: a run spec becomes a Ray Train ``TorchTrainer`` run, and its end an exit code.

The one place that builds a Ray Train run, not the only module that imports Ray: the crash ledger
(an actor, train/launch/crash_loop.py), the preStop drain (train/launch/drain.py), the workers'
``ray.train`` calls (train/hf/progress.py, notice.py) and the CNN job's Ray Data (jobs/cnn/train.py) do too.
Local mode starts its cluster with the ``ray`` command (spotray/local/local_ray.py) and imports no Ray.
Nothing below train/launch and train/hf imports Ray (tests/unit/test_layering.py).

What each part of the spec becomes:
- ``workers`` -> ``ScalingConfig``: one training worker per GPU (``replicas x gpu``), or ``replicas``
  CPU workers, each asking for its share of the replica's CPUs;
- the run name -> ``RunConfig(name=...)``, stable across attempts, so Ray's run directory is reused;
- worker failures -> ``FailureConfig(max_failures=-1)`` by default: a worker process or node that
  dies is replaced and training goes on from the latest complete checkpoint in our store (seed 003);
  a training loop that crashes again and again (raises, or its worker dies by a signal) is not
  (train/launch/crash_loop.py);
- preemptions -> ``FailureConfig(max_preemption_failures=0)`` unless the run is elastic or has spare
  pods: a notice ends the attempt (its emergency checkpoint, then the controller's next attempt), so
  Ray Train must not start a group of its own after the drain deadline. Its default (-1) did, on nodes
  the driver's own SIGTERM had drained, and that group never started: an attempt "running" for 15
  minutes (nemesis trial 39 of seed 1, its checkpoint 0.9 s past the deadline;
  tests/integration/test_driver_notice.py). An elastic group keeps Ray Train's restarts: they are how
  it goes on smaller; so does a group with spares (``spec.workers.spareReplicas``): they are how it
  goes on at full size on a spare. For both, the driver's own SIGTERM is bounded by
  train/launch/driver_notice.py.

Ray Train V2 (the default in Ray 2.60) has no ``TorchTrainer.restore``: a new attempt is a new
``fit()``, and resume comes from our own S3 checkpoints, which each worker fetches at start. We
never hand checkpoints to Ray (``ray.train.report`` carries metrics only), so Ray's storage path
holds only small run metadata and may be a local directory.

Exit codes and the records an attempt leaves: spotray/contract/attempts.py. A ``fit()`` that returns normally
either finished or stopped on a preemption notice (rank 0's record says which), or gave up on a
training loop that kept crashing (train/launch/crash_loop.py); one that raises ended the attempt for
the cause ``fit_failure_cause`` gives (spotray/contract/errors.py): the training code's failure (1),
bad input (2), or an infrastructure fault (75: Ray's cluster, the store), which spends no budget.
Before ``fit()`` the driver claims the checkpoint URI (the fence, spotray/contract/attempts.py): older
attempts still draining stop uploading and pruning.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spotray.contract.attempts import (
    EXIT_INFRASTRUCTURE,
    EXIT_OK,
    EXIT_PREEMPTED,
    AttemptId,
    AttemptOutcome,
    attempt_exit_code,
    exit_code_for_cause,
)
from spotray.contract.errors import Cause, SpotrayError, cause_of
from spotray.contract.extras import extra_required
from spotray.contract.spec import DEFAULT_START_DEADLINE_SECONDS, RunContext
from spotray.train.checkpoints.resume import prefetch_in_background
from spotray.train.checkpoints.start_from import copied_already, start_from
from spotray.train.launch.crash_loop import CrashLoop, guard_against_crash_loops, ledger_verdict, start_ledger
from spotray.train.launch.driver_notice import EXIT_MARGIN_S, DriverNotice, stop_without_drain
from spotray.train.launch.node_watch import NodeWatch, coordinator_refresh
from spotray.train.launch.ray_capacity import worker_resources
from spotray.train.launch.ray_drain import drain_all_nodes
from spotray.train.records.attempt_records import read_record, write_fence, write_outcome
from spotray.train.records.event_log import EventLog, event_log_from_env
from spotray.train.storage.store import ObjectStore

with extra_required("ray"):
    import psutil  # a dependency of Ray's
    import ray
    import ray.exceptions
    import ray.train
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

log = logging.getLogger(__name__)

# Ray Train polls for draining nodes every 5 s by default; a 15 s notice cannot spare that much. Its
# controller asks the workers how they are every 2 s by default: a worker whose node went after its
# emergency checkpoint (a run with a spare pod, or an elastic one) is seen gone up to that late, and
# every second of it is a second before the group starts again. One small call per worker a second.
RAY_TRAIN_SETTINGS = {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1"}
# How often an elastic worker group looks for room to grow (seconds); unset: Ray Train's default.
RESIZE_CHECK_ENV = "SPOTRAY_ELASTIC_RESIZE_CHECK_S"
# An elastic group that lost a node may first try its old size again: Ray Train sizes it from a view
# of the cluster that lags (a vanished node is marked dead after about 30 s of missed heartbeats, and
# the view is re-read every 20 s, or at once by train/launch/node_watch.py). Ray Train then waits this
# long for a placement group that cannot be placed (its default, 60 s) before it counts again and goes
# on smaller: 86 s without training at 60 in tests/integration/test_elastic.py; with a spot notice and
# 30 s here, 67 s from the node's exit to the smaller group. It bounds only the placement group's wait
# (Ray 2.60's WorkerGroup._start_impl), which takes well under a second when the resources are free,
# so an elastic run starts on what is there rather than wait for a full group; a user who needs
# more sets the variable.
ELASTIC_RAY_TRAIN_SETTINGS = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
# Ray Train (2.60) waits RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s unless set) for the worker group's
# placement group, then tries again: for ever, unless FailureConfig.controller_failure_limit says
# otherwise. A group the cluster cannot hold now (a spot pool out of capacity, a kept RayCluster smaller
# than the spec) kept the RayJob Running and its pods held, with no deadline: the controller's start
# deadline ends only a RayJob that never ran (issue #69). So the tries are bounded to fit in the run's
# start deadline (RunContext.start_deadline_seconds; the controller's default where none was given):
# the attempt then ends as an infrastructure fault that says what Ray could not
# place, and the next attempt tries again. The count is the whole attempt's: a group restarted
# many times, each time placed only after a full try, ends its attempt the same way.
RAY_TRAIN_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
RAY_TRAIN_START_TIMEOUT_DEFAULT_S = 60.0
# Ray Train (2.60) asks a detached actor of Ray Data's, the AutoscalingCoordinator, for the worker
# group's resources as its controller starts, gives it 5 s to answer, and asks again before it starts
# any worker if it did not. The first ask on a cluster creates that actor, whose new process took
# longer than 5 s to start on 2 cores ("Failed to send resource request" in the driver's log): 5-10 s
# of every fresh cluster's start-up spent waiting. Asked for as the driver connects, the actor starts
# while Ray Train's controller does (bench/micro/ray_train_start.py). Ray's own function, so the actor is
# the one Ray Train would make (same name, node and options); a Ray without it skips this.
AUTOSCALING_COORDINATOR_MODULE = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"
# How long a preemption notice gives (GKE gives 15 s, AWS 120 s); the drain deadline we announce.
DEFAULT_GRACE_SECONDS = 15
# Faults of Ray's cluster and of Ray Train's machinery, not of the training code: a node, an actor or
# an object lost, a scheduling or start-up that failed or timed out. A worker's exception in the
# training code reaches fit() as WorkerGroupError. Not among them: a cluster that can never hold the
# workers (InsufficientClusterResourcesError), a spec to change, which would otherwise be retried for ever.
_RAY_FAULT_NAMES = (
    "RaySystemError",
    "RayActorError",
    "ActorUnschedulableError",
    "TaskUnschedulableError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "RpcError",
    "OutOfDiskError",
)
# Ray Train's own live in a private module (Ray 2.60), and ControllerError is not in every Ray that
# pyproject.toml allows (>= 2.50): where a Ray lacks them, those faults count as the training code's,
# as before, instead of the launcher failing to import.
_RAY_TRAIN_FAULT_NAMES = (
    "WorkerHealthCheckTimeoutError",
    "WorkerHealthCheckFailedError",
    "WorkerGroupStartupTimeoutError",
    "WorkerGroupStartupFailedError",
    "CollectiveTimeoutError",
    "CheckpointManagerInitializationError",
)


def _ray_train_internal_exceptions() -> Any:
    try:
        return importlib.import_module("ray.train.v2._internal.exceptions")
    except ImportError:
        return None


def _exception_types(module: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    return tuple(getattr(module, name) for name in names if module is not None and hasattr(module, name))


RAY_FAULTS: tuple[type[BaseException], ...] = _exception_types(ray.exceptions, _RAY_FAULT_NAMES) + _exception_types(
    _ray_train_internal_exceptions(), _RAY_TRAIN_FAULT_NAMES
)
# What fit() raises when Ray Train's controller failed; its ``controller_failure`` is the cause.
CONTROLLER_ERROR: tuple[type[BaseException], ...] = _exception_types(ray.train, ("ControllerError",))
# The controller's failure when the worker group was not placed in time (``worker_group_start_tries``).
START_TIMEOUT_ERROR = _exception_types(_ray_train_internal_exceptions(), ("WorkerGroupStartupTimeoutError",))
# What fit() raises when a preemption's drain deadline passed before the group stopped (Ray 2.60's Ray
# Train; an older Ray has no preemption handling, and neither this nor ``max_preemption_failures``).
PREEMPTION_ERROR: tuple[type[BaseException], ...] = _exception_types(ray.train, ("PreemptionError",))


def build_scaling_config(context: RunContext, environ: dict[str, str] | None = None) -> ScalingConfig:
    """Ray Train's worker group for the spec: elastic, a ``(min, max)`` range, when minReplicas < replicas.

    An elastic group restarts with the workers that are left when a node is lost, and Ray Train
    checks every ``SPOTRAY_ELASTIC_RESIZE_CHECK_S`` seconds (Ray's default: 60) whether more could
    run, restarting the group bigger if so. Each restart resumes from the latest checkpoint.
    """
    workers = context.spec.workers
    resources = worker_resources(workers)
    if not workers.elastic:
        return ScalingConfig(num_workers=workers.num_workers, use_gpu=workers.gpu > 0, resources_per_worker=resources)
    # Ray Train V2's ScalingConfig (what ray.train exports in Ray 2.60); the type stubs know V1's.
    options: dict[str, Any] = {
        "num_workers": (workers.min_workers, workers.num_workers),
        "use_gpu": workers.gpu > 0,
        "resources_per_worker": resources,
    }
    resize_check = (os.environ if environ is None else environ).get(RESIZE_CHECK_ENV)
    if resize_check:
        options["elastic_resize_monitor_interval_s"] = float(resize_check)
    return ScalingConfig(**options)


def worker_group_start_tries(context: RunContext, worker_env: dict[str, str]) -> tuple[int, float]:
    """(tries, seconds each) Ray Train gets to place the worker group: as many as fit in the start
    deadline (RAY_TRAIN_START_TIMEOUT_ENV, above), at least one; -1 (for ever) with no deadline (0)."""
    per_try = float(worker_env.get(RAY_TRAIN_START_TIMEOUT_ENV) or RAY_TRAIN_START_TIMEOUT_DEFAULT_S)
    given = context.start_deadline_seconds
    deadline = DEFAULT_START_DEADLINE_SECONDS if given is None else given
    if deadline == 0:
        return -1, per_try
    return max(1, math.ceil(deadline / per_try)), per_try


def build_run_config(
    context: RunContext, storage_path: str, *, max_worker_failures: int = -1, start_tries: int | None = None
) -> RunConfig:
    # Ray Train V2's FailureConfig (what ray.train exports in Ray 2.60); the type stubs know V1's.
    failures: dict[str, Any] = {"max_failures": max_worker_failures}
    if not context.spec.workers.elastic and not context.spec.workers.spare_replicas and PREEMPTION_ERROR:
        failures["max_preemption_failures"] = 0  # a notice ends the attempt (see the module docstring)
    if start_tries is not None and "controller_failure_limit" in inspect.signature(FailureConfig).parameters:
        failures["controller_failure_limit"] = start_tries  # a Ray whose FailureConfig has it (2.60 does)
    return RunConfig(name=context.name, storage_path=storage_path, failure_config=FailureConfig(**failures))


def default_storage_path() -> str:
    """Ray's run metadata: the shared NFS path when the cluster has one, else a local directory."""
    return os.environ.get("SPOTRAY_RAY_STORAGE", str(Path(tempfile.gettempdir()) / "spotray-ray-results"))


def fit_failure_cause(error: BaseException) -> Cause:
    """Whose fault it is that ``fit()`` raised ``error``: ``cause_of``, with Ray's own faults (``RAY_FAULTS``)
    as infrastructure, and what Ray Train's controller failed on (``ControllerError``) classified in turn."""
    if isinstance(error, CONTROLLER_ERROR):
        return fit_failure_cause(error.controller_failure)  # type: ignore[attr-defined]
    if isinstance(error, RAY_FAULTS):
        return Cause.INFRASTRUCTURE
    return cause_of(error)


def recorded_preemption(store: ObjectStore, attempt: AttemptId) -> AttemptOutcome | None:
    """The preemption rank 0 recorded once its emergency checkpoint was complete; None when it recorded none."""
    marker = read_record(store, attempt.preemption_key, attempt)
    if marker is None:
        return None
    return AttemptOutcome(
        EXIT_PREEMPTED, marker.get("step"), "stopped on a preemption notice after a complete emergency checkpoint"
    )


def outcome_after_fit(store: ObjectStore, attempt: AttemptId, crash_loop: CrashLoop | None = None) -> AttemptOutcome:
    """How a ``fit()`` that returned normally ended: gave up on a crash loop (its cause's code: only the
    training code's own errors are a failure), preempted, or finished."""
    if crash_loop is not None:
        return AttemptOutcome(exit_code_for_cause(crash_loop.cause), crash_loop.checkpoint_step, crash_loop.message)
    return recorded_preemption(store, attempt) or AttemptOutcome(EXIT_OK, None, "training finished")


def outcome_after_preemption(store: ObjectStore, attempt: AttemptId, error: BaseException) -> AttemptOutcome:
    """How an attempt ended whose ``fit()`` raised Ray Train's ``PreemptionError``: its nodes were drained
    as preempted and the deadline passed before the group stopped by itself. A preemption either way;
    whether its emergency checkpoint is complete is read from rank 0's record, written once it was."""
    return recorded_preemption(store, attempt) or AttemptOutcome(
        EXIT_PREEMPTED,
        None,
        f"preempted before its emergency checkpoint was complete ({error}); the next attempt resumes from "
        "the newest complete checkpoint",
    )


def preempted_outcome(store: ObjectStore, attempt: AttemptId, error: BaseException) -> AttemptOutcome:
    """``outcome_after_preemption``; a store that cannot say ends the attempt with its fault's code (75
    when it is down: tried again, and the next attempt resumes or finds the run finished)."""
    try:
        return outcome_after_preemption(store, attempt, error)
    except SpotrayError as unread:
        return AttemptOutcome(
            attempt_exit_code(unread), None, f"preempted, and the store cannot say how: {unread.problem}"
        )


def outcome_of_fit_error(error: BaseException, start_tries: tuple[int, float] | None = None) -> AttemptOutcome:
    """How an attempt whose ``fit()`` raised ``error`` ended: its cause's exit code, and words for the
    record. ``start_tries``: what ``worker_group_start_tries`` gave Ray Train to place the worker group."""
    cause = fit_failure_cause(error)
    inner = error.controller_failure if isinstance(error, CONTROLLER_ERROR) else error  # type: ignore[attr-defined]
    if isinstance(inner, SpotrayError):
        detail = inner.problem
    elif isinstance(inner, START_TIMEOUT_ERROR) and start_tries is not None:
        tries, per_try = start_tries
        # Not Ray's own words: rebuilt in the driver, they give the driver's timeout, not the one Ray Train used.
        workers = getattr(inner, "num_workers", "its")
        detail = (
            f"Ray could not place the worker group ({workers} workers) within the start deadline ({tries} tries "
            f"of {per_try:.0f} s): no node had room for it (a spot pool out of capacity, or a kept RayCluster "
            "smaller than the spec); the next attempt tries again"
        )
    elif cause is Cause.TRAINING:
        detail = f"training failed: {type(error).__name__}: {error}"
    else:
        detail = f"an infrastructure fault, not the training code's: {type(inner).__name__}: {inner}"
    return AttemptOutcome(exit_code_for_cause(cause), None, detail)


def spotray_env_for_workers(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's ``SPOTRAY_*`` settings (run context, event log), which the workers need too.

    S3 credentials are deliberately not among them: workers get those from their own environment
    (the pod's env from a Secret, or the local cluster's), never through Ray, whose dashboard shows
    a job's runtime_env to anyone who can open it.
    """
    source = os.environ if environ is None else environ
    return {key: value for key, value in source.items() if key.startswith("SPOTRAY_")}


def driver_env_vars(wanted: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """``wanted`` minus what the Ray job's own runtime env already sets.

    Under a Ray job (a RayJob's entrypoint) the job's runtime env, which already carries
    ``SPOTRAY_RUN``, is merged with ``ray.init``'s, and Ray refuses any key set in both.
    """
    raw = (os.environ if environ is None else environ).get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return wanted
    job_env = (json.loads(raw).get("runtime_env") or {}).get("env_vars") or {}
    return {key: value for key, value in wanted.items() if key not in job_env}


def autoscaling_coordinator(module: str = AUTOSCALING_COORDINATOR_MODULE) -> Any | None:
    """Ask for Ray Train's AutoscalingCoordinator now, in the background (AUTOSCALING_COORDINATOR_MODULE).

    Returns its actor handle; None on a Ray without it, or when asking failed, which only leaves Ray
    Train to make it as before (and an elastic run without its node watch).
    """
    try:
        get_or_create = importlib.import_module(module).get_or_create_autoscaling_coordinator
    except (ImportError, AttributeError):
        return None
    try:
        return get_or_create()  # a handle at once; the actor's process starts on this node meanwhile
    except Exception as error:  # noqa: BLE001 - a start-up shortcut never ends an attempt: Ray Train asks again
        log.warning("could not start Ray Train's autoscaling coordinator early (Ray Train will): %s", error)
        return None


def start_autoscaling_coordinator(module: str = AUTOSCALING_COORDINATOR_MODULE) -> bool:
    """Whether the coordinator was asked for (``autoscaling_coordinator``)."""
    return autoscaling_coordinator(module) is not None


def install_driver_sigterm(
    context: RunContext, store: ObjectStore, grace_seconds: int, notice_margin_s: float
) -> DriverNotice:
    """What the driver's SIGTERM does; the returned notice says whether it came (``received``).

    On a cluster of the attempt's own (a RayJob's, local mode's), the whole cluster is going: every
    node is drained as preempted, so the workers take an emergency checkpoint (``DriverNotice``). On
    a cluster that outlives the attempt, the job is only being stopped, and nothing is drained
    (``stop_without_drain``): the notice then never says received.
    """
    notice = DriverNotice(
        grace_seconds,
        drain_all_nodes,
        lambda waited: end_overdue_attempt(store, context.attempt_id, waited),
        margin_s=notice_margin_s,
    )
    if context.ray_cluster_outlives_attempt:
        stop_without_drain()
    else:
        notice.install()
    return notice


def end_overdue_attempt(store: ObjectStore, attempt: AttemptId, waited_s: float) -> None:
    """End the attempt from the notice's bound (train/launch/driver_notice.py): record it, then exit at once.

    ``os._exit``: the main thread is stuck in ``fit()``, which a normal exit would wait for. The Ray
    cluster is not this process's to stop (KubeRay's, or local mode's, which stops it).
    """
    error = TimeoutError(f"fit() had not ended {waited_s:.0f} s after the driver's SIGTERM drained every node")
    outcome = preempted_outcome(store, attempt, error)
    print(f"error: {outcome.detail}", file=sys.stderr)
    try:
        write_outcome(store, attempt, outcome)
    except SpotrayError as unwritten:
        log.warning("could not record the attempt's outcome in the store: %s", unwritten)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(outcome.exit_code)


def ray_runs_on_this_machine(environ: dict[str, str] | None = None) -> bool:
    """Whether the Ray cluster this driver joins is on this machine: none named (``ray.init`` starts one
    here) or one at a loopback address (local mode), which no other machine can have joined."""
    address = (environ if environ is not None else os.environ).get("RAY_ADDRESS", "")
    if not address:
        return True
    host = urlsplit(address if "://" in address else f"//{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_from_done(store: ObjectStore, attempt: AttemptId, uri: str) -> bool:
    """Whether ``checkpoint.startFrom`` was copied already; a store that cannot say is asked again after
    the fence (the copy's own first read), where its fault ends the attempt with the right code."""
    try:
        return copied_already(store, attempt.run_id, uri)
    except SpotrayError:
        return False


def copy_start_checkpoint(store: ObjectStore, context: RunContext, events: EventLog) -> int | None:
    """Copy ``checkpoint.startFrom`` into the run's prefix (train/checkpoints/start_from.py); the exit
    code when it cannot be, None when it is there."""
    start = context.spec.checkpoint.start_from
    assert start is not None
    try:
        copied = start_from(store, start, context.attempt_id)
    except SpotrayError as error:
        print(f"error: cannot start from {start}: {error}", file=sys.stderr)
        return attempt_exit_code(error)
    if copied is not None:
        events.emit("started_from", uri=copied.uri, step=copied.step, replaced=copied.replaced)
    return None


def milestone(events: EventLog, event: str, what: str, context: RunContext) -> None:
    """A start-up milestone of the attempt: in local mode's event log, and in the driver's log (where a
    cluster's start-up is read: bench/on_testbed/recovery_real_pods.py, bench/on_testbed/fresh_start_real_pods.py)."""
    events.emit(event)
    log.info("attempt %d: %s", context.attempt, what)


def process_age_s() -> float:
    """Seconds since this process started: Python's own start and the imports before ``launch``."""
    started: float = psutil.Process().create_time()
    return time.time() - started


def launch(
    train_loop: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    context: RunContext,
    store: ObjectStore,
    *,
    storage_path: str | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    notice_margin_s: float = EXIT_MARGIN_S,
    datasets: dict[str, Any] | None = None,
    resume_dir: Path | None = None,
) -> int:
    """Run ``train_loop`` on every worker of a Ray Train run for this attempt; return the exit code.

    ``datasets`` (Ray Data datasets by name, or functions that build them, which Ray Train calls
    when each worker group starts) are split across the workers; each worker reads its part with
    ``ray.train.get_dataset_shard(name)``.

    ``grace_seconds``: the drain deadline the driver's own SIGTERM announces; ``notice_margin_s``: how
    long past it the driver waits for ``fit()`` before it ends the attempt itself (driver_notice.py).

    ``resume_dir``: where the workers keep their node's copy of the checkpoint they resume from
    (``ResumeFetch``). When the workers run on this machine, the driver starts that download at
    once, while Ray starts (seconds to tens of seconds); the workers' own fetch then finds it there.
    """
    # Where an attempt's start-up goes, for the goodput ledger and bench/micro/local_recovery.py: from here
    # (the driver's imports and the job's own checks done) to Ray connected, to the worker group asked for.
    events = event_log_from_env()
    milestone(events, "driver_start", f"driver ready, {process_age_s():.1f} s after its process started", context)
    start = context.spec.checkpoint.start_from
    to_copy = start is not None and not start_from_done(store, context.attempt_id, start)
    if resume_dir is not None and ray_runs_on_this_machine() and not to_copy:
        prefetch_in_background(store, resume_dir)
    # The workers read the run context (their attempt's identity included) from SPOTRAY_RUN,
    # also when this driver was started by hand and made its own.
    worker_env = {**spotray_env_for_workers(), **context.to_env(), **RAY_TRAIN_SETTINGS}
    if context.spec.workers.elastic:
        worker_env |= {key: value for key, value in ELASTIC_RAY_TRAIN_SETTINGS.items() if key not in os.environ}
    start_tries = worker_group_start_tries(context, {**os.environ, **worker_env})
    if not ray.is_initialized():
        # RAY_ADDRESS is set by the RayJob (KubeRay) and by local mode; without it Ray starts its own.
        try:
            ray.init(
                address=os.environ.get("RAY_ADDRESS"),
                logging_level=logging.WARNING,
                runtime_env={"env_vars": driver_env_vars(worker_env)},
            )
        except (ConnectionError, TimeoutError, ray.exceptions.RaySystemError) as error:
            print(f"error: cannot connect to the Ray cluster (an infrastructure fault): {error}", file=sys.stderr)
            return EXIT_INFRASTRUCTURE
    milestone(events, "ray_connected", "connected to Ray", context)
    coordinator = autoscaling_coordinator()
    if coordinator is not None and context.spec.workers.elastic:
        # Ray Train's elastic resizes see a node leave or join within a second, not 20 s.
        NodeWatch(coordinator_refresh(coordinator)).start()
    notice = install_driver_sigterm(context, store, grace_seconds, notice_margin_s)
    # From here on, older attempts of this checkpoint URI stop uploading and pruning (spotray/contract/attempts.py).
    try:
        write_fence(store, context.attempt_id)
    except SpotrayError as error:
        print(f"error: cannot claim the checkpoint URI for this attempt: {error}", file=sys.stderr)
        return attempt_exit_code(error)
    if to_copy and (refused := copy_start_checkpoint(store, context, events)) is not None:
        return refused
    ledger = start_ledger(context.attempt_id)
    trainer = TorchTrainer(
        guard_against_crash_loops(train_loop),
        train_loop_config=loop_config,
        scaling_config=build_scaling_config(context),
        run_config=build_run_config(context, storage_path or default_storage_path(), start_tries=start_tries[0]),
        datasets=datasets,
    )
    milestone(events, "worker_group_asked", "asking Ray Train for the worker group", context)
    try:
        trainer.fit()
    except Exception as error:  # noqa: BLE001 (whatever ended the attempt, it ends with its cause's code)
        notice.fit_ended()
        # Ray Train's PreemptionError: its nodes were drained as preempted and the deadline passed. After
        # the driver's own SIGTERM every node was, so whatever fit() raised, the attempt was preempted.
        preempted = isinstance(error, PREEMPTION_ERROR) or notice.received
        outcome = (
            preempted_outcome(store, context.attempt_id, error)
            if preempted
            else outcome_of_fit_error(error, start_tries)
        )
        print(f"error: {outcome.detail}", file=sys.stderr)
        if isinstance(error, SpotrayError) and not preempted:
            print(f"  fix: {error.fix}", file=sys.stderr)
    else:
        notice.fit_ended()
        try:
            outcome = outcome_after_fit(store, context.attempt_id, ledger_verdict(ledger))
        except SpotrayError as error:  # the preemption marker cannot be read: finished or preempted is unknown
            print(f"error: training ended, but how cannot be read from the store: {error}", file=sys.stderr)
            # Tried again (75) when the store is down: the next attempt resumes, or finds the run finished.
            outcome = AttemptOutcome(attempt_exit_code(error), None, f"how training ended is unknown: {error.problem}")
    try:
        write_outcome(store, context.attempt_id, outcome)
    except SpotrayError as error:
        log.warning("could not record the attempt's outcome in the store: %s", error)
    return outcome.exit_code
