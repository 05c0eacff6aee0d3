"""kopf wiring: every handler is a few lines that call controller/reconcile.py.

- a TrainingRun that is new or whose spec changed (generation != status.observedGeneration) ->
  reconcile now;
- every active run is reconciled every ``SPOTRAY_RECONCILE_INTERVAL_SECONDS`` (progress and
  checkpoints from S3, the backoff before the next attempt) by controller/resync.py, or by a kopf
  timer when replicas peer for HA;
- a RayJob of ours finished -> reconcile its run at once (the attempt ended);
- a pod of ours got a ``DisruptionTarget`` condition (node gone, evicted, spot reclaim) -> the fact
  is written on its attempt's RayJob, where the lifecycle reads it when the attempt ends.
The Kubernetes and S3 clients block, so reconciles run on threads: the TrainingRun event handler is
async and hands them to a pool of its own (a burst of new runs must not queue behind each other);
the RayJob and pod handlers are synchronous and run in kopf's thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes import config as kube_config

from spotray.controller import metrics
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.reconcile import disruption_note, reconcile
from spotray.controller.resync import Resync
from spotray.controller.watch_health import WatchChecker, WatchHealth
from spotray.train.api_names import (
    ATTEMPT_LABEL,
    DISRUPTION_ANNOTATION,
    GROUP,
    PLURAL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_PLURAL,
    RUN_LABEL,
    VERSION,
    rayjob_name,
)

log = logging.getLogger(__name__)
CONFIG = ControllerConfig.from_env()
_cluster: Cluster | None = None
_resync: Resync | None = None
_watch_health = WatchHealth(CONFIG.watch_grace_seconds)
_watch_checker: WatchChecker | None = None
EXECUTOR_THREADS = 50  # threads for reconciles triggered by events: a burst of new runs at once
_handler_pool = ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="spotray-reconcile")


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
    # One connection per handler thread: urllib3's default pool of 4 makes the other threads
    # open (and TLS-handshake) a fresh connection per request under a burst of new runs.
    configuration.connection_pool_maxsize = EXECUTOR_THREADS
    return Cluster(client.ApiClient(configuration))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _cluster  # noqa: PLW0603 - one API client per process, shared by the handler threads
    _cluster = _make_cluster()
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's would repeat it
    settings.execution.max_workers = EXECUTOR_THREADS
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
    metrics.serve(CONFIG.metrics_port)
    if not CONFIG.peering:
        global _resync, _watch_checker  # noqa: PLW0603 - one loop of each per process
        _resync = Resync(_periodic, CONFIG.reconcile_interval_seconds)
        _resync.start()
        _watch_checker = WatchChecker(
            _watch_health, lambda: cluster().list_runs(CONFIG.namespaces), CONFIG.watch_grace_seconds / 3
        )
        _watch_checker.start()
    log.info("spotray controller: %s", CONFIG)


@kopf.on.cleanup()
def stop_resync(**_: Any) -> None:
    if _resync is not None:
        _resync.stop()
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


def _periodic(namespace: str, name: str) -> float | None:
    return reconcile(cluster(), CONFIG, namespace, name)


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
        if _resync is not None:
            _resync.forget(namespace, name)
        return
    _watch_health.saw((namespace, name), str(meta.get("resourceVersion")), time.monotonic())
    if _resync is not None:
        _resync.track(namespace, name, status.get("phase"))
    if meta.get("generation") != status.get("observedGeneration"):
        # A new object's body is current; any other is read fresh (it may predate our own patches).
        fresh = dict(body) if event["type"] == "ADDED" else None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(_handler_pool, reconcile, cluster(), CONFIG, namespace, name, fresh)


def on_timer(meta: kopf.Meta, **_: Any) -> None:
    _periodic(str(meta.namespace), str(meta.name))


if CONFIG.peering:
    # Standby replicas must not reconcile: kopf pauses its own timers there (see controller/resync.py).
    kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.reconcile_interval_seconds, initial_delay=1)(on_timer)


def _finished(status: kopf.Status, **_: Any) -> bool:
    return status.get("jobDeploymentStatus") in ("Complete", "Failed")


# An event handler, not a change handler: kopf then keeps no state on RayJobs, which KubeRay owns.
@kopf.on.event(RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, labels={RUN_LABEL: kopf.PRESENT}, when=_finished)
def on_rayjob_finished(meta: kopf.Meta, **_: Any) -> None:
    reconcile(cluster(), CONFIG, str(meta.namespace), meta.labels[RUN_LABEL])


def _disrupted(body: kopf.Body, **_: Any) -> bool:
    return disruption_note(dict(body)) is not None


@kopf.on.event("", "v1", "pods", labels={RUN_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT}, when=_disrupted)
def on_pod_disrupted(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
    note = disruption_note(dict(body))
    if note is None:
        return
    job = rayjob_name(meta.labels[RUN_LABEL], int(meta.labels[ATTEMPT_LABEL]))
    log.info("%s/%s: %s", meta.namespace, job, note)
    cluster().annotate_rayjob(str(meta.namespace), job, {DISRUPTION_ANNOTATION: note})
