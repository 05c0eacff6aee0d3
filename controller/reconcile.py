"""One reconcile of one TrainingRun: observe, plan (controller/lifecycle.py), persist, act.

Restart safety comes from the order: the new status (with attempt N+1 recorded) is written before
RayJob N+1 is created, and RayJob names are deterministic. A controller killed between the two finds
"attempt N+1 running, RayJob missing" on restart and creates it; killed after both, the create
answers 409 and nothing is duplicated. Every reconcile reads the TrainingRun fresh from the API
server (not from a watch cache that may lag its own last patch), under a per-run lock, so two
triggers for one run never interleave.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from controller import metrics
from controller.config import ControllerConfig
from controller.kube import Cluster
from controller.lifecycle import (
    FAILED,
    TERMINAL_PHASES,
    AttemptMarkers,
    Event,
    Observation,
    RayJobView,
    RunState,
    conditions,
    parse_timestamp,
    plan,
)
from controller.rayjob import build_rayjob
from controller.run_store import last_checkpoint_status, open_run_store, progress_status, read_markers
from train.errors import SpotrayError
from train.runspec import InvalidSpecError, TrainingRun, parse_training_run

log = logging.getLogger(__name__)
DISRUPTION_ANNOTATION = "spotray.dev/disruption"

_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


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


def _report(cluster: Cluster, run: TrainingRun, state: RunState, config: ControllerConfig) -> dict[str, Any]:
    """status.progress and status.lastCheckpoint from S3; a read failure becomes a condition, not an error."""
    current = state.current
    if current is None:
        return {}
    try:
        store = open_run_store(run, cluster, config)
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
    cluster: Cluster, run: TrainingRun, state: RunState, job: RayJobView | None, config: ControllerConfig
) -> AttemptMarkers:
    if state.current is None or job is None or not job.finished or job.job_status == "SUCCEEDED":
        return AttemptMarkers()
    try:
        return read_markers(open_run_store(run, cluster, config), state.current.attempt)
    except (SpotrayError, OSError, ValueError) as error:
        log.warning("cannot read the attempt markers of %s/%s: %s", run.namespace, run.name, error)
        return AttemptMarkers()


def reconcile(cluster: Cluster, config: ControllerConfig, namespace: str, name: str) -> float | None:
    """Bring one TrainingRun one step closer to done; returns seconds until it wants another look."""
    started = time.perf_counter()
    with _lock_for(namespace, name):
        try:
            return _reconcile_locked(cluster, config, namespace, name)
        except Exception:
            metrics.RECONCILE_ERRORS.inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _reconcile_locked(cluster: Cluster, config: ControllerConfig, namespace: str, name: str) -> float | None:
    body = cluster.get_run(namespace, name)
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
    job = None
    if state.current is not None:
        job = rayjob_view(cluster.get_rayjob(namespace, state.current.rayJob))
    decided = plan(
        Observation(
            run=run,
            state=state,
            job=job,
            markers=_markers(cluster, run, state, job, config),
            settle_seconds=config.settle_seconds,
        ),
        now,
    )
    new_state = decided.state
    if state.phase in TERMINAL_PHASES and new_state == state:
        metrics.set_phase(namespace, name, state.phase)
        return None  # finished runs keep their last status; nothing to read or write
    generation = body["metadata"].get("generation", 0)
    new_status = new_state.to_status()
    new_status["observedGeneration"] = generation
    new_status["conditions"] = conditions(new_state, status.get("conditions") or [], generation, now)
    if True:
        report = _report(cluster, run, new_state, config)
        resumed_from = report.pop("resumedFrom", None)
        storage_error = report.pop("storageError", None)
        new_status.update(report)
        if resumed_from is not None and new_state.current is not None and new_status["attempts"]:
            new_status["attempts"][-1]["resumedFrom"] = resumed_from
        if storage_error:
            new_status["message"] = f"{new_status['message']} (cannot read checkpoints: {storage_error})"
    # Persist first, then act: see the module docstring.
    cluster.patch_run_status(namespace, name, new_status)
    if decided.delete_rayjob:
        cluster.delete_rayjob(namespace, decided.delete_rayjob)
    if decided.create_attempt is not None:
        created = cluster.create_rayjob(build_rayjob(run, decided.create_attempt, body["metadata"]["uid"], config))
        if created:
            metrics.ATTEMPTS_STARTED.inc()
    for event in decided.events:
        cluster.post_event(body, event, now)
        log.info("%s/%s: %s: %s", namespace, name, event.reason, event.message)
    ended = [a for a in new_state.attempts if a not in state.attempts and a.endTime]
    for attempt in ended:
        metrics.ATTEMPT_OUTCOMES.labels(outcome=attempt.outcome).inc()
    metrics.set_phase(namespace, name, new_state.phase)
    return decided.requeue_after_s


def disruption_note(pod: dict[str, Any]) -> str | None:
    """ "pod P on node N: <reason>: <message>" when the pod carries a true DisruptionTarget condition."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            where = f"pod {pod['metadata']['name']} on node {pod.get('spec', {}).get('nodeName') or '?'}"
            detail = condition.get("message") or ""
            return f"{where}: {condition.get('reason') or 'disrupted'}" + (f": {detail}" if detail else "")
    return None
