"""Draining Ray nodes as a preemption: the GCS call ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` makes.

Shared by the driver (its own SIGTERM drains every node, train/launch/launcher.py) and a worker pod's
preStop hook (train/launch/drain.py). It imports Ray alone: the hook is a new Python process that
runs within a spot notice's grace period, and importing the launcher (Ray Train, torch, pandas) took
it 14 s on 2 cores.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from spotray.contract.extras import extra_required

with extra_required("ray"):
    import ray


def drain_nodes(node_ids: Collection[str], reason_message: str, grace_seconds: int) -> int:
    """Tell Ray these nodes are being preempted; returns how many accepted the drain.

    Ray Train passes the notice to the workers through ``ray.train.get_preemption_info``; they take
    an emergency checkpoint and stop.
    """
    from ray.core.generated import autoscaler_pb2  # noqa: PLC0415 (generated protobufs, only needed here)

    # The same GCS call `ray drain-node` makes; Ray ships no typed public API for it.
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)  # type: ignore[attr-defined]
    deadline_ms = int(time.time() * 1000) + grace_seconds * 1000
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")  # type: ignore[attr-defined]
    accepted = 0
    for node_id in node_ids:
        ok, _ = gcs.drain_node(node_id, reason, reason_message, deadline_ms)
        accepted += int(ok)
    return accepted


def alive_nodes(nodes: list[dict[str, Any]] | None = None) -> frozenset[str]:
    """The IDs of the live Ray nodes among ``nodes`` (``ray.nodes()``'s form), or the cluster's now, from
    the GCS. The one reading of "alive": the drain, the crash-loop guard and the node watch share it."""
    listed = ray.nodes() if nodes is None else nodes  # type: ignore[no-untyped-call]
    return frozenset(node["NodeID"] for node in listed if node.get("Alive"))


def drain_all_nodes(reason_message: str, grace_seconds: int) -> int:
    """Drain every live node: what the driver does with its own SIGTERM (the whole cluster is going)."""
    return drain_nodes(alive_nodes(), reason_message, grace_seconds)
