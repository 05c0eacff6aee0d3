"""How many more training workers the Ray cluster could place now: spare room for a spot notice;
and which worker pods are idle spares right now.

A fixed-size run with spare worker pods (``spec.workers.spareReplicas``) goes on after a spot
notice only when the workers the notice takes can start again elsewhere (train/hf/notice.py
``goes_on_without``). That is a fact read from Ray at the notice, not a hope: a spare that a
notice took a moment before, or one that has not joined yet, is not room, and the run stops on
its emergency checkpoint as a run without spares does.

It imports Ray alone. Ray has no public per-node view of free resources without its dashboard,
so it reads the GCS through ``ray._private.state`` (``available_resources_per_node`` is Ray's
DeveloperAPI; the draining nodes are what ``ray drain-node`` and our preStop hook mark).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from spotray.contract.extras import extra_required
from spotray.contract.spec import WorkerSpec
from spotray.train.records.progress_log import WorkerHosts

with extra_required("ray"):
    import ray
    import ray._private.state

# A node's free CPU is a float sum of fractions (0.1 + 0.2 ...): allow for rounding below a whole slot.
_ROUNDING = 1e-6


def worker_resources(workers: WorkerSpec) -> dict[str, float]:
    """What one Ray Train worker asks Ray for: its share of the pod's CPUs, and a GPU if the pods have them."""
    resources: dict[str, float] = {"CPU": workers.cpu_per_worker}
    if workers.gpu:
        resources["GPU"] = 1
    return resources


def slots_on(available: Mapping[str, float], per_worker: Mapping[str, float]) -> int:
    """How many workers that each need ``per_worker`` fit in one node's ``available`` resources."""
    needed = {name: amount for name, amount in per_worker.items() if amount > 0}
    if not needed:
        return 0  # a worker that asks for nothing is not one this reads room for
    return min(int((available.get(name, 0.0) + _ROUNDING) // amount) for name, amount in needed.items())


def free_worker_slots(
    per_worker: Mapping[str, float],
    available_by_node: Mapping[str, Mapping[str, float]],
    draining: frozenset[str],
) -> int:
    """Workers that fit on the live nodes that are not draining (a draining node takes no new work)."""
    return sum(slots_on(available, per_worker) for node, available in available_by_node.items() if node not in draining)


def spare_room(workers: WorkerSpec) -> int:
    """``free_worker_slots`` for the run's workers as Ray's GCS sees the cluster now (inside a Ray worker or driver)."""
    per_worker = worker_resources(workers)
    available_by_node = ray._private.state.available_resources_per_node()  # type: ignore[no-untyped-call]
    draining = frozenset(ray._private.state.state.get_draining_nodes())
    return free_worker_slots(per_worker, available_by_node, draining)


def worker_hosts(
    per_worker: Mapping[str, float],
    nodes: Iterable[Mapping[str, Any]],
    available_by_node: Mapping[str, Mapping[str, float]],
    draining: frozenset[str],
    seen_at: float,
) -> WorkerHosts:
    """Split the nodes that could run a worker into idle and busy, by what Ray has free on each (at ``seen_at``).

    ``nodes`` as ``ray.nodes()`` gives them (NodeID, Alive, NodeManagerHostname, Resources: the
    totals). A node that could host no worker at all (the head, ``num-cpus: 0``) is neither; a
    draining one neither (it is leaving). On Kubernetes a Ray node's hostname is its pod's name.
    """
    idle: list[str] = []
    busy: list[str] = []
    for node in nodes:
        node_id, hostname = node.get("NodeID"), node.get("NodeManagerHostname")
        if not node.get("Alive") or not node_id or not hostname or node_id in draining:
            continue
        room = slots_on(node.get("Resources") or {}, per_worker)
        if room > 0:
            free = slots_on(available_by_node.get(node_id, {}), per_worker)
            (idle if free >= room else busy).append(str(hostname))
    return WorkerHosts(idle=tuple(sorted(idle)), busy=tuple(sorted(busy)), time=seen_at)


def run_worker_hosts(workers: WorkerSpec) -> WorkerHosts:
    """``worker_hosts`` for the run's workers as Ray's GCS sees the cluster now (inside a Ray worker or driver).

    Rank 0 records it in the attempt's progress; the controller moves an idle spare off a node it
    shares with a busy worker (controller/spare_placement.py).
    """
    available_by_node = ray._private.state.available_resources_per_node()  # type: ignore[no-untyped-call]
    draining = frozenset(ray._private.state.state.get_draining_nodes())
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    return worker_hosts(worker_resources(workers), nodes, available_by_node, draining, seen_at=time.time())
