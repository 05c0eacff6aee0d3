"""Move an idle spare worker pod off the node it shares with a training worker (issue 39), pure.

A run with spares (``spec.workers.spareReplicas``) asks for its worker pods on different nodes, but
only as a preference, and only when a pod is scheduled: when a reclaim takes a node, KubeRay makes
the lost pod's replacement at once, while that node is still gone, so the scheduler puts the new
spare beside the worker on the spot node left. Nothing moves it later, and the next reclaim of that
node takes the worker and its spare together (docs/goodput.md: 26 s to train again instead of 16 s).

So the controller moves it, from facts read, never guessed:

- which pods are idle and which train is Ray's view, recorded by the run's rank 0 in the attempt's
  progress (``worker_hosts``, train/launch/ray_capacity.py): a Ray node's hostname is its pod's name;
- which pods share a node is the API server's (the pods' ``spec.nodeName``).

A pod named idle that shares a node with a pod named busy is moved: its name goes into the run's
RayCluster's ``scaleStrategy.workersToDelete``, KubeRay deletes it and makes a new one, and the
scheduler places that one by the same preference, on another node if one has room now. Where none
has, the new spare lands beside the worker again; the next try then waits twice as long (from
``FIRST_BACKOFF_S`` up to ``MAX_BACKOFF_S``), so a pool with one spot node costs a spare's restart
every half hour, not a churn. Only a run's own RayCluster (``controller.rayClusterPerRun``) is
moved: the controller may patch those, and a RayJob's own cluster lasts one attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from spotray.contract.names import RAY_NODE_TYPE_LABEL
from spotray.contract.status import format_date_time, parse_timestamp
from spotray.train.records.progress_log import WorkerHosts

# The record is Ray's view at one moment: older than this, it may describe a layout that changed.
HOSTS_FRESH_S = 60.0
# The wait after a move before the next, doubled each time the new spare landed on the same node again.
FIRST_BACKOFF_S = 120.0
MAX_BACKOFF_S = 1800.0


# The kubelet gives a pod's containers its name as hostname, cut to 63 bytes without a trailing - or .
MAX_HOSTNAME = 63


def pod_hostname(name: str) -> str:
    """The hostname a pod named ``name`` has (what Ray reports as its node's hostname)."""
    return name[:MAX_HOSTNAME].rstrip("-.")


@dataclass(frozen=True)
class WorkerPod:
    """One running worker pod of the run's Ray cluster, as the API server lists it."""

    name: str
    node: str

    @property
    def hostname(self) -> str:
        return pod_hostname(self.name)


@dataclass(frozen=True)
class SpareMoved:
    """The last move, kept in an annotation on the run's RayCluster (``SPARE_MOVED_ANNOTATION``)."""

    pod: str
    node: str
    beside: str  # the busy pod it shared the node with
    at: datetime
    tries: int  # moves in a row off this node (each one waits longer)

    def to_annotation(self) -> str:
        fields = {"pod": self.pod, "node": self.node, "beside": self.beside, "at": format_date_time(self.at)}
        return json.dumps({**fields, "tries": self.tries}, sort_keys=True)

    @classmethod
    def from_annotation(cls, text: str | None) -> SpareMoved | None:
        """The annotation as written; None when missing or unreadable (then no move waits on it)."""
        try:
            raw = json.loads(text or "")
            at = parse_timestamp(raw["at"])
            if at is None:
                return None
            return cls(str(raw["pod"]), str(raw["node"]), str(raw["beside"]), at, max(1, int(raw["tries"])))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @property
    def backoff(self) -> timedelta:
        return timedelta(seconds=min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self.tries - 1)))


def worker_pods(pods: Sequence[Mapping[str, Any]]) -> list[WorkerPod]:
    """The Running worker pods that are not being deleted, with their nodes (the head and submitter left out)."""
    found = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        if labels.get(RAY_NODE_TYPE_LABEL) != "worker" or meta.get("deletionTimestamp"):
            continue
        if status.get("phase") == "Running" and meta.get("name") and spec.get("nodeName"):
            found.append(WorkerPod(str(meta["name"]), str(spec["nodeName"])))
    return found


def spare_to_move(
    pods: Sequence[WorkerPod], hosts: WorkerHosts | None, last: SpareMoved | None, now: datetime
) -> SpareMoved | None:
    """The idle spare to move now, or None.

    Only from a fresh record written after the last move (it then shows where the new spare went),
    once the last move's backoff has passed; only a pod Ray named idle, beside one Ray named busy.
    """
    if hosts is None or now.timestamp() - hosts.time > HOSTS_FRESH_S:
        return None
    if last is not None and (hosts.time <= last.at.timestamp() or now - last.at < last.backoff):
        return None
    by_node: dict[str, list[WorkerPod]] = {}
    for pod in pods:
        by_node.setdefault(pod.node, []).append(pod)
    for node, here in sorted(by_node.items()):
        # Two pods whose names agree on their first 63 bytes are one hostname: neither can be told apart.
        named = {pod.hostname: pod.name for pod in here}
        if len(named) < len(here):
            continue
        idle = sorted(name for host, name in named.items() if host in hosts.idle)
        busy = sorted(name for host, name in named.items() if host in hosts.busy)
        if idle and busy:
            tries = last.tries + 1 if last is not None and last.node == node else 1
            return SpareMoved(pod=idle[0], node=node, beside=busy[0], at=now, tries=tries)
    return None
