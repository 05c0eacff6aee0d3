"""Where an attempt's start-up went (issue 39, item 3): status.attempts[].startup, pure.

A reclaim costs the steps since the last checkpoint plus the time until training runs again, and on
spot capacity the second dominates. So each attempt's start-up is split at the milestones a user can
act on, in seconds from its RayJob's creation (the attempt's ``startTime``):

- ``podsReady``: every Ray pod of the attempt Ready (KubeRay's head and workers, not the submitter):
  scheduling, the image, the container, Ray's start and KubeRay's probes. From the pods' own
  ``Ready`` conditions, read from the API server once;
- ``trainingLoop``: the worker group began the training loop: the job's submission, the driver's
  imports and Ray Train's worker group. From the job's progress object;
- ``firstStep``: the first logged step ended: the model built, the checkpoint fetched, the first batch.

The milestones come from three clocks (the controller's, the kubelet's, the job's pod); on one
cluster they agree to well under a second, and a milestone is never shown before its RayJob.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from spotray.contract.names import RAY_NODE_TYPE_LABEL
from spotray.contract.status import AttemptStartup, parse_timestamp, unchecked_timestamp


def pods_ready_at(pods: Sequence[dict[str, Any]]) -> datetime | None:
    """When the last of the Ray pods became Ready; None while one is not Ready (or there are none).

    The submitter pod of K8sJobMode carries the attempt's labels too, but no Ray node type: it is not
    part of the cluster the job waits for.
    """
    ready: list[datetime] = []
    ray_pods = [pod for pod in pods if RAY_NODE_TYPE_LABEL in ((pod.get("metadata") or {}).get("labels") or {})]
    for pod in ray_pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        since = next(
            (c.get("lastTransitionTime") for c in conditions if c.get("type") == "Ready" and c.get("status") == "True"),
            None,
        )
        moment = unchecked_timestamp(since)
        if moment is None:
            return None
        ready.append(moment)
    return max(ready, default=None)


def _seconds_after(start: datetime, moment: datetime | None) -> float | None:
    return None if moment is None else round(max(0.0, (moment - start).total_seconds()), 1)


def attempt_startup(
    start_time: str | None,
    *,
    pods_ready: datetime | None,
    training_loop_at: float | None,
    first_step_at: float | None,
) -> AttemptStartup | None:
    """The attempt's start-up milestones; None without a start time (an entry rebuilt from an old status)."""
    start = parse_timestamp(start_time) if start_time else None
    if start is None:
        return None

    def at(unix: float | None) -> datetime | None:
        return None if unix is None else datetime.fromtimestamp(unix, UTC)

    return AttemptStartup(
        pods_ready=_seconds_after(start, pods_ready),
        training_loop=_seconds_after(start, at(training_loop_at)),
        first_step=_seconds_after(start, at(first_step_at)),
    )
