"""kopf wiring: every handler is a few lines that call controller/reconcile.py.

- TrainingRun created, resumed after a controller restart, or its spec changed -> reconcile now;
- a timer reconciles every ``SPOTRAY_RECONCILE_INTERVAL_SECONDS`` (progress and checkpoints from S3,
  the backoff before the next attempt);
- a RayJob of ours finished -> reconcile its run at once (the attempt ended);
- a pod of ours got a ``DisruptionTarget`` condition (node gone, evicted, spot reclaim) -> the fact
  is written on its attempt's RayJob, where the lifecycle reads it when the attempt ends.
Handlers are synchronous: kopf runs them in its thread pool, and the Kubernetes and S3 clients block.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes import config as kube_config

from controller import metrics
from controller.config import ControllerConfig
from controller.kube import RUN_PLURAL, RUN_VERSION, Cluster
from controller.rayjob import ATTEMPT_LABEL, RUN_LABEL, rayjob_name
from controller.reconcile import DISRUPTION_ANNOTATION, disruption_note, reconcile
from train.runspec import API_GROUP

log = logging.getLogger(__name__)
CONFIG = ControllerConfig.from_env()
_cluster: Cluster | None = None


def cluster() -> Cluster:
    global _cluster  # noqa: PLW0603 - one API client per process, made once kopf has logged in
    if _cluster is None:
        try:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kube_config.ConfigException:
            kube_config.load_kube_config()  # type: ignore[no-untyped-call]
        from kubernetes import client  # noqa: PLC0415 - after the config is loaded

        _cluster = Cluster(client.ApiClient())
    return _cluster


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's would repeat it
    settings.execution.max_workers = 20
    settings.watching.server_timeout = 300
    metrics.serve(CONFIG.metrics_port)
    log.info("spotray controller: %s", CONFIG)


@kopf.on.probe(id="trainingruns")
def runs_known(**_: Any) -> int:
    return metrics.known_runs()


@kopf.on.create(API_GROUP, RUN_VERSION, RUN_PLURAL)
@kopf.on.resume(API_GROUP, RUN_VERSION, RUN_PLURAL)
@kopf.on.update(API_GROUP, RUN_VERSION, RUN_PLURAL, field="spec")
def on_run_changed(meta: kopf.Meta, **_: Any) -> None:
    reconcile(cluster(), CONFIG, str(meta.namespace), str(meta.name))


@kopf.timer(API_GROUP, RUN_VERSION, RUN_PLURAL, interval=CONFIG.reconcile_interval_seconds, initial_delay=1)
def on_timer(meta: kopf.Meta, **_: Any) -> None:
    reconcile(cluster(), CONFIG, str(meta.namespace), str(meta.name))


def _finished(status: kopf.Status, **_: Any) -> bool:
    return status.get("jobDeploymentStatus") in ("Complete", "Failed")


# An event handler, not a change handler: kopf then keeps no state on RayJobs, which KubeRay owns.
@kopf.on.event("ray.io", "v1", "rayjobs", labels={RUN_LABEL: kopf.PRESENT}, when=_finished)
def on_rayjob_finished(meta: kopf.Meta, **_: Any) -> None:
    reconcile(cluster(), CONFIG, str(meta.namespace), meta.labels[RUN_LABEL])


@kopf.on.event("", "v1", "pods", labels={RUN_LABEL: kopf.PRESENT, ATTEMPT_LABEL: kopf.PRESENT})
def on_pod_event(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
    note = disruption_note(dict(body))
    if note is None:
        return
    job = rayjob_name(meta.labels[RUN_LABEL], int(meta.labels[ATTEMPT_LABEL]))
    log.info("%s/%s: %s", meta.namespace, job, note)
    cluster().annotate_rayjob(str(meta.namespace), job, {DISRUPTION_ANNOTATION: note})
