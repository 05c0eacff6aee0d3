"""What the pods of an attempt that has not started wait for, read from their status: the scheduler
cannot place them (capacity, spotray/decisions/capacity_wait.py), or a placed pod cannot start
wherever it goes (stuck: the start deadline ends the attempt in its words).

Every Unschedulable pod counts as waiting for capacity, whatever the scheduler's reason: on a cloud
cluster a node selector or a taint no node matches today is a node pool scaled to zero, which its
autoscaler (Karpenter, the cluster autoscaler) grows while the pod waits. The scheduler's message
says which, and the run's status quotes it. The one exception is a volume claim that is missing or
being deleted: no node will ever come for it, so the pod is stuck.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from spotray.decisions.observation import PodsWaiting

# Why the kubelet cannot start a placed pod's container, whatever the capacity (pkg/kubelet/images
# and kuberuntime): the image cannot be pulled or named, or a Secret, ConfigMap or key it reads is missing.
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# PodScheduled=False reasons that mean "not placed yet": the scheduler found no node, or a scheduling
# gate (a queue's, such as Kueue's for plain pods) holds it back.
UNPLACED_REASONS = frozenset({"Unschedulable", "SchedulingGated"})
# kube-scheduler's volumebinding plugin, in its words: the pod names a claim its namespace lacks (the
# chart's shared volume is made in the release namespace and the namespaces it is told of).
MISSING_CLAIM = re.compile(r'persistentvolumeclaim "[^"]*" (not found|is being deleted)')


def pods_waiting(pods: Sequence[dict[str, Any]]) -> PodsWaiting:
    """What the attempt's pending pods wait for; empty when none waits for either (placed, starting)."""
    capacity: list[str] = []
    stuck: list[str] = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") not in (None, "Pending"):
            continue
        name = str((pod.get("metadata") or {}).get("name") or "?")
        for condition in status.get("conditions") or []:
            unplaced = condition.get("type") == "PodScheduled" and condition.get("status") == "False"
            if unplaced and condition.get("reason") in UNPLACED_REASONS:
                said = f"pod {name}: {condition.get('message') or condition.get('reason')}"
                (stuck if MISSING_CLAIM.search(said) else capacity).append(said)
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                said = f"{waiting['reason']}: {waiting.get('message') or 'no message'}"
                stuck.append(f"pod {name}: container {container.get('name') or '?'}: {said}")
    return PodsWaiting(capacity=_first(capacity), stuck=_first(stuck))


def _first(notes: list[str]) -> str:
    """The first note, and how many more pods say the like (their words are alike: one node pool)."""
    if len(notes) <= 1:
        return notes[0] if notes else ""
    more = len(notes) - 1
    return f"{notes[0]} (and {more} more pod{'s' if more > 1 else ''})"
