"""What the controller reads from a run's checkpoint URI: markers, progress, the last complete checkpoint.

Why read S3 instead of having the job report to the API server: the checkpoint manifests in S3
are the only truth about what a resume would use (a checkpoint is complete when its manifest is
there and matches its files), the job needs no Kubernetes credentials, and the status stays right
even when the job died mid-report. The cost is one LIST and a few small GETs per run and reconcile.

Credentials come from the run's Secret (``spec.checkpoint.secretRef``, or the chart's default),
the same one the pods get by reference; the endpoint from that Secret's ``AWS_ENDPOINT_URL`` or the
controller's ``SPOTRAY_S3_ENDPOINT``. Without a Secret, the controller's own environment applies
(an IAM role, for example).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.lifecycle import AttemptMarkers, timestamp
from spotray.train.checkpoint import attempt_outcome_key, latest_complete_checkpoint, preemption_marker_key
from spotray.train.progress_log import read_attempt_progress
from spotray.train.runspec import TrainingRun
from spotray.train.store import ObjectStore, RetryPolicy, StoreConfig, get_bytes_if_exists, open_store

log = logging.getLogger(__name__)


def store_config(run: TrainingRun, cluster: Cluster, config: ControllerConfig) -> StoreConfig:
    base = replace(StoreConfig.from_env(), connect_timeout_s=2.0, read_timeout_s=10.0)
    secret_name = run.spec.checkpoint.secret_ref or config.s3_secret
    secret = cluster.read_secret(run.namespace, secret_name) if secret_name else None
    endpoint = config.s3_endpoint or base.endpoint_url
    if secret is None:
        return replace(base, endpoint_url=endpoint)
    return replace(
        base,
        endpoint_url=secret.get("AWS_ENDPOINT_URL") or endpoint,
        region=secret.get("AWS_REGION") or base.region,
        access_key_id=secret.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=secret.get("AWS_SECRET_ACCESS_KEY"),
        session_token=secret.get("AWS_SESSION_TOKEN"),
    )


# A reconcile must not hang on an unreachable S3 server: give up after a few seconds, report it in
# the status, and try again at the next reconcile.
CONTROLLER_RETRY = RetryPolicy(deadline_s=5.0, first_delay_s=0.2, max_delay_s=1.0)


def open_run_store(run: TrainingRun, cluster: Cluster, config: ControllerConfig) -> ObjectStore:
    return open_store(run.spec.checkpoint.uri, store_config(run, cluster, config), CONTROLLER_RETRY)


def _read_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    raw = get_bytes_if_exists(store, key)
    if raw is None:
        return None
    data: dict[str, Any] = json.loads(raw)
    return data


def read_markers(store: ObjectStore, attempt: int) -> AttemptMarkers:
    return AttemptMarkers(
        outcome=_read_json(store, attempt_outcome_key(attempt)),
        preempted=_read_json(store, preemption_marker_key(attempt)),
    )


def progress_status(store: ObjectStore, attempt: int) -> tuple[dict[str, Any] | None, int | None]:
    """(status.progress, the step the attempt resumed from) from the attempt's progress object."""
    progress = read_attempt_progress(store, attempt)
    if progress is None or progress.last_step is None:
        return None, progress.resumed_from if progress else None
    status: dict[str, Any] = {
        "step": progress.last_step,
        "totalSteps": progress.max_steps,
        "loss": round(progress.last_loss, 6) if progress.last_loss is not None else None,
        "updateTime": timestamp(datetime.fromtimestamp(progress.updated, UTC)),
    }
    speed = progress.steps_per_second()
    if speed is not None:
        status["stepsPerSecond"] = round(speed, 3)
    return {k: v for k, v in status.items() if v is not None}, progress.resumed_from


def last_checkpoint_status(store: ObjectStore) -> dict[str, Any] | None:
    info = latest_complete_checkpoint(store)
    if info is None or info.manifest is None:
        return None
    return {
        "step": info.step,
        "uri": str(store.uri.join(info.prefix)),
        "time": timestamp(datetime.fromtimestamp(info.manifest.created_at, UTC)),
    }
