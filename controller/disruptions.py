"""Facts about lost pods and nodes: a pod's ``DisruptionTarget`` condition (node deleted, evicted, spot
reclaim) in words and time, the nodes an attempt's pods were placed on (the scheduler's Events), and a
node gone or made anew since: what the pod watcher (handlers.py) writes on the attempt's RayJob and
the reconcile (reconcile.py) reads back when the controller was not watching.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from spotray.contract.names import (
    DISRUPTED_AT_ANNOTATION,
    DISRUPTION_ANNOTATION,
    HEAD_LOST_ANNOTATION,
    RAY_CLUSTER_LABEL,
    RAY_NODE_TYPE_LABEL,
    RUN_LABEL,
)
from spotray.contract.status import (
    RunStatus,
    format_date_time,
    unchecked_timestamp,
)
from spotray.controller.kube import Cluster
from spotray.decisions.observation import HEAD_POD_NOTE


def _disruption_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's DisruptionTarget condition when it is true (node deleted, evicted, spot reclaim)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return dict(condition)
    return None


def disruption_note(pod: dict[str, Any]) -> str | None:
    """ "pod P on node N: <reason>: <message>" when the pod carries a true DisruptionTarget condition
    ("the Ray head's pod P ..." when it is the head's)."""
    condition = _disruption_condition(pod)
    if condition is None:
        return None
    labels = pod["metadata"].get("labels") or {}
    whose = HEAD_POD_NOTE if labels.get(RAY_NODE_TYPE_LABEL) == "head" else "pod "
    where = f"{whose}{pod['metadata']['name']} on node {pod.get('spec', {}).get('nodeName') or '?'}"
    detail = condition.get("message") or ""
    return f"{where}: {condition.get('reason') or 'disrupted'}" + (f": {detail}" if detail else "")


# The scheduler's words in its "Scheduled" Event (k8s.io/kubernetes pkg/scheduler/schedule_one.go).
SCHEDULED = re.compile(r"^Successfully assigned (\S+) to (\S+)$")


def scheduled_nodes(
    pods: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]], rayjob: str
) -> dict[str, tuple[str, datetime | None]]:
    """node -> (a pod of the RayJob's that was placed on it, when), from the scheduler's Events (which
    outlive pods deleted with their node, for the API server's event TTL, an hour by default) and
    the pods that are left. KubeRay names every pod of a RayJob's cluster ``<rayjob>-...``."""
    placed: dict[str, tuple[str, datetime | None]] = {}
    for event in events:
        pod_name = str((event.get("involvedObject") or {}).get("name") or "")
        found = SCHEDULED.match(str(event.get("message") or ""))
        if found is None or not pod_name.startswith(f"{rayjob}-"):
            continue
        when = event.get("eventTime") or event.get("firstTimestamp") or event.get("lastTimestamp")
        placed.setdefault(found.group(2), (pod_name, unchecked_timestamp(when)))
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            placed.setdefault(str(node), (str(pod["metadata"]["name"]), None))
    return placed


def node_loss_note(placed: dict[str, tuple[str, datetime | None]], created: dict[str, datetime | None]) -> str | None:
    """ "pod P on node N: ..." for the first node a pod was placed on that is gone or was made anew
    since (a spot VM reclaimed and a new one under its name); None when every node is still there."""
    for node in sorted(placed):
        pod, placed_at = placed[node]
        made = created.get(node)
        if node in created and made is None:
            why = "the node no longer exists"
        elif made is not None and placed_at is not None and made > placed_at:
            why = f"the node was created anew at {format_date_time(made)}, after the pod was placed on it"
        else:
            continue
        return f"pod {pod} on node {node}: {why} (read back: the controller was not watching when it went)"
    return None


def record_cluster_pod_disrupted(cluster: Cluster, pod: dict[str, Any], now: datetime) -> str | None:
    """A pod of a run's cluster kept across attempts was disrupted: write the fact where the lifecycle
    reads it. Returns the run's name, to reconcile it now (None: the pod is no run's cluster's).

    The pod has no attempt: it counts for the attempt running on its cluster when it was disrupted,
    which the run's status names (``status.attempts[-1].rayCluster``). A lost head also marks the
    cluster itself (``HEAD_LOST_ANNOTATION``): it is not used again, and the attempt ends at once.
    """
    note = disruption_note(pod)
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    namespace, run_name, ray_cluster = meta.get("namespace"), labels.get(RUN_LABEL), labels.get(RAY_CLUSTER_LABEL)
    if note is None or not (namespace and run_name and ray_cluster):
        return None
    when = disruption_time(pod) or format_date_time(now)
    if labels.get(RAY_NODE_TYPE_LABEL) == "head":
        cluster.annotate_ray_cluster(namespace, ray_cluster, {HEAD_LOST_ANNOTATION: note})
    run = cluster.get_run(namespace, run_name)
    attempts = RunStatus.of(run).attempts if run is not None else None
    current = attempts[-1] if attempts else None
    if current is not None and current.ray_cluster == ray_cluster and current.end_time is None:
        annotations = {DISRUPTION_ANNOTATION: note, DISRUPTED_AT_ANNOTATION: when}
        cluster.annotate_rayjob(namespace, current.ray_job, annotations)
    return str(run_name)


def disruption_time(pod: dict[str, Any]) -> str | None:
    """When the pod's DisruptionTarget condition became true, as the API server wrote it."""
    condition = _disruption_condition(pod)
    return (condition.get("lastTransitionTime") or None) if condition else None
