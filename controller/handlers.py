"""kopf wiring: the TrainingRun and RayJob handlers are a few lines that hand a run to controller/work_queue.py.

- a TrainingRun that is new or whose spec changed (generation != status.observedGeneration) ->
  reconcile it first thing (an urgent request on the work queue);
- a RayJob of ours finished -> reconcile its run first thing too (the attempt ended);
- every active run is refreshed periodically (progress and checkpoints from S3, a start deadline)
  by the work queue, at a bounded rate, or by a kopf timer when replicas peer for HA;
- a TrainingSweep that is new or changed, or one of its trials (a TrainingRun labelled with it) that
  changed -> reconcile the sweep (controller/sweep_reconcile.py) on a queue of its own;
- a pod of ours got a ``DisruptionTarget`` condition (node gone, evicted, spot reclaim) -> the fact
  is written on its attempt's RayJob, where the lifecycle reads it when the attempt ends; a pod of a
  run's cluster kept across attempts (``ray_cluster_per_run``) counts for the attempt running on it,
  and a lost head marks the cluster too and has the run reconciled at once.
The Kubernetes and S3 clients block, so reconciles run on the queue's worker threads; those
handlers only enqueue and return, so kopf's watch streams never wait on a reconcile. Two do not go
through the queue: the pod handler writes its one annotation itself, and with peering the kopf timer
reconciles its run itself; both are plain functions, which kopf runs on its own threads
(``KOPF_THREADS``). The rest is startup, cleanup and the health probes.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import config as kube_config

from spotray.contract.names import (
    ATTEMPT_LABEL,
    DEPLOYMENT_ENDED,
    DISRUPTED_AT_ANNOTATION,
    DISRUPTION_ANNOTATION,
    GROUP,
    PLURAL,
    RAY_CLUSTER_LABEL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_PLURAL,
    RUN_LABEL,
    SWEEP_LABEL,
    TERMINAL_PHASES,
    VERSION,
    rayjob_name,
)
from spotray.contract.status import RunStatus, format_date_time
from spotray.contract.sweep import SWEEP_PLURAL
from spotray.controller import metrics
from spotray.controller.config import ControllerConfig
from spotray.controller.disruptions import disruption_note, disruption_time, record_cluster_pod_disrupted
from spotray.controller.kube import Cluster
from spotray.controller.reconcile import reconcile, settled
from spotray.controller.sweep_reconcile import REFRESH_S as SWEEP_REFRESH_S
from spotray.controller.sweep_reconcile import reconcile_sweep
from spotray.controller.watch_health import WatchChecker, WatchHealth
from spotray.controller.work_queue import WorkQueue

log = logging.getLogger(__name__)
CONFIG = ControllerConfig.from_env()
_cluster: Cluster | None = None
_watch_health = WatchHealth(CONFIG.watch_grace_seconds)
_watch_checker: WatchChecker | None = None
WORKERS = 16  # reconcile threads: enough to keep the API server busy with a burst of new runs
REFRESH_WORKERS = 2  # of which at most this many refresh; the others are kept for urgent work
KOPF_THREADS = 4


def _reconcile_one(namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
    # Under a burst of new runs (other requests waiting or in progress besides this one), each
    # reconcile creates its RayJob and leaves the status write for later (controller/reconcile.py).
    # Not with peering: the queue then tracks no runs to come back to.
    burst = not CONFIG.peering and _queue.backlog() > 1
    return reconcile(cluster(), CONFIG, namespace, name, body, defer_status=burst)


_queue = WorkQueue(
    _reconcile_one,
    interval_s=CONFIG.reconcile_interval_seconds,
    refreshes_per_second=CONFIG.refreshes_per_second,
    workers=WORKERS,
    refresh_workers=REFRESH_WORKERS,
)


# Sweeps on a queue of their own, so that a sweep's decisions (an Optuna study rebuilt from its
# trials) never hold up a run's reconcile; a sweep is one object, so a few threads are plenty.
_sweeps = WorkQueue(
    lambda namespace, name, _body: reconcile_sweep(cluster(), namespace, name),
    interval_s=SWEEP_REFRESH_S,
    refreshes_per_second=CONFIG.refreshes_per_second,
    workers=2,
    refresh_workers=1,
)


def cluster() -> Cluster:
    assert _cluster is not None, "the startup handler makes the API client before any other handler runs"
    return _cluster


def _make_cluster() -> Cluster:
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    from kubernetes import client  # noqa: PLC0415 - after the config is loaded

    configuration = client.Configuration.get_default_copy()
    # One connection per thread that calls the API server (the queue's workers, kopf's threads for
    # the pod handler, the event poster, the watch check): urllib3's default pool of 4 makes the
    # others open (and TLS-handshake) a fresh connection per request under a burst of new runs.
    configuration.connection_pool_maxsize = WORKERS + KOPF_THREADS + 2
    return Cluster(client.ApiClient(configuration))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _cluster  # noqa: PLW0603 - one API client per process, shared by the handler threads
    _cluster = _make_cluster()
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's would repeat it
    settings.execution.max_workers = KOPF_THREADS  # only the pod handler runs there: one call each
    # A watch that goes quiet is restarted: the API server ends it after server_timeout, the client
    # gives up client_timeout later, and kopf reconnects a stream with no event or bookmark for
    # watching.inactivity_timeout (70 s by default): a half-open connection never blocks for ever.
    # kopf's own calls (status patches, events) get a bound too; ours have theirs (controller/kube.py).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    # Watch exactly the resources and namespaces we are told: no scanning of CRDs and namespaces,
    # which would need cluster-wide list rights that a namespaced install does not grant.
    settings.scanning.disabled = True
    metrics.REFRESH_INTERVAL.set_function(_queue.interval_s)
    metrics.URGENT_BACKLOG.set_function(_queue.backlog)
    metrics.serve(CONFIG.metrics_port)
    _queue.start()
    _sweeps.start()
    if not CONFIG.peering:
        global _watch_checker  # noqa: PLW0603 - one loop per process
        _watch_checker = WatchChecker(
            _watch_health, lambda: cluster().list_runs(CONFIG.namespaces), CONFIG.watch_grace_seconds / 3
        )
        _watch_checker.start()
    log.info("spotray controller: %s", CONFIG)


@kopf.on.cleanup()
def stop_workers(**_: Any) -> None:
    _queue.stop()
    _sweeps.stop()
    if _watch_checker is not None:
        _watch_checker.stop()


@kopf.on.probe(id="trainingruns")
def runs_known(**_: Any) -> int:
    return metrics.known_runs()


@kopf.on.probe(id="watch")
def watch_delivering(**_: Any) -> str:
    """Fails /healthz (HTTP 500) while the TrainingRun watch is stalled (controller/watch_health.py)."""
    if _watch_health.problem:
        raise kopf.PermanentError(_watch_health.problem)  # permanent: kopf would otherwise retry the probe
    return "ok"


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_run_event(event: kopf.RawEvent, body: kopf.Body, meta: kopf.Meta, status: kopf.Status, **_: Any) -> None:
    """Every TrainingRun event: new runs and spec changes are reconciled at once, all are tracked.

    An event handler rather than kopf's create/update handlers: those keep their state in an
    annotation on each object, which is one more write per new run while a burst of them waits.
    "Changed" is simply ``metadata.generation != status.observedGeneration``.
    """
    namespace, name = str(meta.namespace), str(meta.name)
    if event["type"] == "DELETED":
        _watch_health.forget((namespace, name))
        _queue.forget(namespace, name)
        return
    _watch_health.saw((namespace, name), str(meta.get("resourceVersion")), time.monotonic())
    stored = RunStatus.from_status(status)
    if not CONFIG.peering:
        _queue.track(namespace, name, finished=settled(stored))
    if meta.get("generation") != stored.observed_generation:
        # A new object's body is current; any other is read fresh (it may predate our own patches).
        _queue.add(namespace, name, dict(body) if event["type"] == "ADDED" else None)


def on_timer(meta: kopf.Meta, **_: Any) -> None:
    reconcile(cluster(), CONFIG, str(meta.namespace), str(meta.name))


if CONFIG.peering:
    # Standby replicas must not reconcile: kopf pauses its own timers there (see controller/work_queue.py).
    kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.reconcile_interval_seconds, initial_delay=1)(on_timer)


@kopf.on.event(GROUP, VERSION, SWEEP_PLURAL)
async def on_sweep_event(event: kopf.RawEvent, meta: kopf.Meta, status: kopf.Status, **_: Any) -> None:
    """A TrainingSweep's events: new sweeps and spec changes are reconciled at once, all are tracked."""
    namespace, name = str(meta.namespace), str(meta.name)
    if event["type"] == "DELETED":
        _sweeps.forget(namespace, name)
        return
    if not CONFIG.peering:
        _sweeps.track(namespace, name, finished=status.get("phase") in TERMINAL_PHASES)
    if meta.get("generation") != status.get("observedGeneration"):
        _sweeps.add(namespace, name)


@kopf.on.event(GROUP, VERSION, PLURAL, labels={SWEEP_LABEL: kopf.PRESENT})
async def on_trial_event(meta: kopf.Meta, **_: Any) -> None:
    """A trial changed (its progress, a rung's objective, its phase): its sweep decides again."""
    _sweeps.add(str(meta.namespace), meta.labels[SWEEP_LABEL])


def on_sweep_timer(meta: kopf.Meta, **_: Any) -> None:
    reconcile_sweep(cluster(), str(meta.namespace), str(meta.name))


if CONFIG.peering:
    kopf.timer(GROUP, VERSION, SWEEP_PLURAL, interval=SWEEP_REFRESH_S, initial_delay=1)(on_sweep_timer)


def _finished(status: kopf.Status, **_: Any) -> bool:
    return status.get("jobDeploymentStatus") in DEPLOYMENT_ENDED


# An event handler, not a change handler: kopf then keeps no state on RayJobs, which KubeRay owns.
@kopf.on.event(RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, labels={RUN_LABEL: kopf.PRESENT}, when=_finished)
async def on_rayjob_finished(meta: kopf.Meta, **_: Any) -> None:
    _queue.add(str(meta.namespace), meta.labels[RUN_LABEL])


def _disrupted(body: kopf.Body, **_: Any) -> bool:
    return disruption_note(dict(body)) is not None


@kopf.on.event("", "v1", "pods", labels={RUN_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT}, when=_disrupted)
def on_pod_disrupted(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
    note = disruption_note(dict(body))
    if note is None:
        return
    job = rayjob_name(meta.labels[RUN_LABEL], int(meta.labels[ATTEMPT_LABEL]))
    log.info("%s/%s: %s", meta.namespace, job, note)
    when = disruption_time(dict(body)) or format_date_time(datetime.now(UTC))
    cluster().annotate_rayjob(str(meta.namespace), job, {DISRUPTION_ANNOTATION: note, DISRUPTED_AT_ANNOTATION: when})


# A run's cluster kept across attempts: its pods carry the run and the cluster, not an attempt.
@kopf.on.event(
    "",
    "v1",
    "pods",
    labels={RUN_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.ABSENT, RAY_CLUSTER_LABEL: kopf.PRESENT},
    when=_disrupted,
)
def on_cluster_pod_disrupted(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
    run_name = record_cluster_pod_disrupted(cluster(), dict(body), datetime.now(UTC))
    if run_name is not None:
        log.info("%s/%s: %s", meta.namespace, meta.name, disruption_note(dict(body)))
        _queue.add(str(meta.namespace), run_name)
