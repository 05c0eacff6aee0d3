"""One reconcile of one TrainingRun: observe, plan (controller/lifecycle.py), create, persist, delete.

Restart safety comes from deterministic names: the next attempt's number is always "the last one
in status.attempts + 1", and its RayJob is ``<run>-a<N>``. So the RayJob is created first (the
user waits for it) and the status written after: a controller killed in between finds the status
one attempt behind on restart, plans the same attempt N again, and its create answers 409; nothing
is duplicated. Deletions go the other way round: the status says "Suspended" before the RayJob is
deleted, and a suspended run's RayJob is deleted again at every reconcile until it is gone.
Reconciles triggered by a change read the TrainingRun fresh from the API server (not from a watch
cache that may lag its own last patch), under a per-run lock, so two triggers never interleave.
Events are posted from a background thread: they are for people and must not slow the loop.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from spotray.controller import metrics
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.lifecycle import (
    FAILED,
    TERMINAL_PHASES,
    AttemptMarkers,
    Event,
    Observation,
    Plan,
    RayJobView,
    RunState,
    conditions,
    parse_timestamp,
    plan,
)
from spotray.controller.rayjob import build_rayjob
from spotray.controller.run_store import (
    last_checkpoint_status,
    open_run_store,
    progress_status,
    read_markers,
    s3_access_refusal,
)
from spotray.train.errors import SpotrayError
from spotray.train.runspec import InvalidSpecError, TrainingRun, parse_training_run
from spotray.train.store import ObjectStore

log = logging.getLogger(__name__)
DISRUPTION_ANNOTATION = "spotray.dev/disruption"

_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()
_EVENTS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotray-events")


def crash_point(name: str) -> None:
    """Die here if SPOTRAY_CRASH_AT names this point: how the e2e tests kill the controller mid-reconcile.

    A SIGKILL from outside cannot hit the window between creating the RayJob and writing the status
    on demand; this can. Unset (always, outside tests) it does nothing.
    """
    if os.environ.get("SPOTRAY_CRASH_AT") == name:
        log.error("SPOTRAY_CRASH_AT=%s: exiting now, as a crash would", name)
        os._exit(70)


def _lock_for(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[f"{namespace}/{name}"]


def rayjob_view(job: dict[str, Any] | None) -> RayJobView | None:
    if job is None:
        return None
    status = job.get("status") or {}
    annotations = job.get("metadata", {}).get("annotations") or {}
    end = status.get("endTime")
    return RayJobView(
        job_status=status.get("jobStatus") or None,
        deployment_status=status.get("jobDeploymentStatus") or None,
        message=status.get("message") or "",
        end_time=parse_timestamp(end) if end else None,
        disruption=annotations.get(DISRUPTION_ANNOTATION),
    )


def _refuse_invalid(cluster: Cluster, body: dict[str, Any], error: InvalidSpecError, now: datetime) -> None:
    status = body.get("status") or {}
    if status.get("phase") == FAILED:
        return  # refused once already; a fix is a new generation, which we would parse fine
    message = "the spec is not valid: " + "; ".join(error.problems)
    state = RunState(phase=FAILED, message=message, failure_reason="InvalidSpec")
    meta = body["metadata"]
    cluster.patch_run_status(
        meta["namespace"],
        meta["name"],
        {
            "phase": FAILED,
            "message": message,
            "observedGeneration": meta.get("generation"),
            "conditions": conditions(state, status.get("conditions") or [], meta.get("generation", 0), now),
        },
    )
    cluster.post_event(body, Event("Warning", "InvalidSpec", message), now)


def _report(run_store: Callable[[], ObjectStore], run: TrainingRun, state: RunState) -> dict[str, Any]:
    """status.progress and status.lastCheckpoint from S3; a read failure goes into the message, not an error."""
    current = state.current
    if current is None:
        return {}
    try:
        store = run_store()
        progress, resumed_from = progress_status(store, current.attempt)
        checkpoint = last_checkpoint_status(store)
    except (SpotrayError, OSError, ValueError) as error:
        log.warning("cannot read %s for %s/%s: %s", run.spec.checkpoint.uri, run.namespace, run.name, error)
        return {"storageError": str(error)}
    report: dict[str, Any] = {"resumedFrom": resumed_from}
    if progress is not None:
        report["progress"] = progress
    if checkpoint is not None:
        report["lastCheckpoint"] = checkpoint
    return report


def _markers(
    run_store: Callable[[], ObjectStore], run: TrainingRun, state: RunState, job: RayJobView | None
) -> AttemptMarkers:
    if state.current is None or job is None or not job.finished or job.job_status == "SUCCEEDED":
        return AttemptMarkers()
    try:
        return read_markers(run_store(), state.current.attempt)
    except (SpotrayError, OSError, ValueError) as error:
        log.warning("cannot read the attempt markers of %s/%s: %s", run.namespace, run.name, error)
        return AttemptMarkers()


_SECRET_SEEN_TTL_S = 60.0
_secrets_seen: dict[tuple[str, str], float] = {}


def _s3_refusal(cluster: Cluster, run: TrainingRun, config: ControllerConfig) -> tuple[str, str] | None:
    """(reason, message) when the run's Secret is missing or may not be used (controller/s3_access.py).

    An allowed Secret is remembered for a minute (many runs share one), a refusal never, so a
    Secret created or labelled to fix a waiting run is seen at once.
    """
    name = run.spec.checkpoint.secret_ref or config.s3_secret
    if name is None:
        return None
    key = (run.namespace, name)
    if time.monotonic() - _secrets_seen.get(key, -_SECRET_SEEN_TTL_S) < _SECRET_SEEN_TTL_S:
        return None
    refused = s3_access_refusal(run, cluster.read_secret(run.namespace, name), config)
    if refused is None:
        _secrets_seen[key] = time.monotonic()
    return refused


def reconcile(
    cluster: Cluster, config: ControllerConfig, namespace: str, name: str, body: dict[str, Any] | None = None
) -> float | None:
    """Bring one TrainingRun one step closer to done; returns seconds until it wants another look.

    ``body``: the object as just created (kopf's create event), which saves a read on the hot path.
    """
    started = time.perf_counter()
    with _lock_for(namespace, name):
        try:
            return _reconcile_locked(cluster, config, namespace, name, body)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile_locked(
    cluster: Cluster, config: ControllerConfig, namespace: str, name: str, body: dict[str, Any] | None
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

    status = body.get("status") or {}
    state = RunState.from_status(status)
    # Opened at most once per reconcile, and only when something needs S3.
    run_store = functools.cache(functools.partial(open_run_store, run, cluster, config))
    decided = _decide(cluster, config, run, run_store=run_store, state=state, message=status.get("message"), now=now)
    if state.phase in TERMINAL_PHASES and decided.state == state:
        metrics.set_phase(namespace, name, state.phase)
        return None  # finished runs keep their last status; nothing to read or write
    generation = body["metadata"].get("generation", 0)
    new_status = _status(
        run,
        run_store,
        state=decided.state,
        previous_conditions=status.get("conditions") or [],
        generation=generation,
        now=now,
        starting=decided.create_attempt is not None,
    )
    # Create, persist, delete: see the module docstring.
    if decided.create_attempt is not None:
        created = cluster.create_rayjob(build_rayjob(run, decided.create_attempt, body["metadata"]["uid"], config))
        if created:
            metrics.ATTEMPTS_STARTED.inc()
        crash_point("rayjob-created")
    cluster.patch_run_status(namespace, name, new_status)
    if decided.delete_rayjob:
        cluster.delete_rayjob(namespace, decided.delete_rayjob)
    for event in decided.events:
        _EVENTS.submit(cluster.post_event, body, event, now)
        log.info("%s/%s: %s: %s", namespace, name, event.reason, event.message)
    for attempt in decided.state.attempts:
        if attempt not in state.attempts and attempt.endTime:
            metrics.ATTEMPT_OUTCOMES.labels(outcome=attempt.outcome).inc()
    metrics.set_phase(namespace, name, decided.state.phase)
    return decided.requeue_after_s


def _decide(
    cluster: Cluster,
    config: ControllerConfig,
    run: TrainingRun,
    *,
    run_store: Callable[[], ObjectStore],
    state: RunState,
    message: str | None,
    now: datetime,
) -> Plan:
    job = None
    if state.current is not None:
        job = rayjob_view(cluster.get_rayjob(run.namespace, state.current.rayJob))
    markers = _markers(run_store, run, state, job)
    observed = Observation(
        run,
        state,
        job,
        markers,
        settle_seconds=config.settle_seconds,
        start_deadline_seconds=config.start_deadline_seconds,
    )
    decided = plan(observed, now)
    refused = _s3_refusal(cluster, run, config) if decided.create_attempt is not None else None
    if refused is None:
        return decided
    # Nothing may run without usable credentials: wait (no attempt spent) and say how to fix it.
    reason, refusal = refused
    events = (Event("Warning", reason, refusal),) if message != refusal else ()
    return Plan(replace(state, message=refusal), events=events, requeue_after_s=config.reconcile_interval_seconds)


def _status(
    run: TrainingRun,
    run_store: Callable[[], ObjectStore],
    *,
    state: RunState,
    previous_conditions: list[dict[str, Any]],
    generation: int,
    now: datetime,
    starting: bool,
) -> dict[str, Any]:
    """The whole new status: the lifecycle's state, conditions, and what S3 says about progress."""
    status = state.to_status()
    status["observedGeneration"] = generation
    status["conditions"] = conditions(state, previous_conditions, generation, now)
    # A new attempt has no progress yet, and its RayJob should not wait for S3 reads.
    report = _report(run_store, run, state) if not starting else {}
    resumed_from = report.pop("resumedFrom", None)
    storage_error = report.pop("storageError", None)
    status.update(report)
    if resumed_from is not None and status["attempts"]:
        status["attempts"][-1]["resumedFrom"] = resumed_from
    if storage_error:
        status["message"] = f"{status['message']} (cannot read checkpoints: {storage_error})"
    return status


def disruption_note(pod: dict[str, Any]) -> str | None:
    """ "pod P on node N: <reason>: <message>" when the pod carries a true DisruptionTarget condition."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            where = f"pod {pod['metadata']['name']} on node {pod.get('spec', {}).get('nodeName') or '?'}"
            detail = condition.get("message") or ""
            return f"{where}: {condition.get('reason') or 'disrupted'}" + (f": {detail}" if detail else "")
    return None
