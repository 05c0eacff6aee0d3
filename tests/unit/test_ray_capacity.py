"""Spare room for a spot notice: how many more workers Ray could place now (train/launch/ray_capacity.py)."""

import pytest

from spotray.contract.spec import WorkerSpec
from spotray.train.launch.ray_capacity import WorkerHosts, free_worker_slots, slots_on, worker_hosts, worker_resources

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("available", "per_worker", "slots"),
    [
        ({"CPU": 1.0}, {"CPU": 1.0}, 1),
        ({"CPU": 0.9999999}, {"CPU": 1.0}, 1),  # fractions summed in floating point
        ({"CPU": 0.5}, {"CPU": 1.0}, 0),
        ({"CPU": 4.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, 1),  # the scarcer resource decides
        ({"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0}, 0),  # a CPU-only node holds no GPU worker
        ({"CPU": 1.0}, {"CPU": 0.25}, 4),
        ({"CPU": 8.0}, {}, 0),  # a worker that asks for nothing is not counted as room
    ],
)
def test_a_node_holds_as_many_workers_as_its_scarcest_resource_allows(
    available: dict[str, float], per_worker: dict[str, float], slots: int
) -> None:
    assert slots_on(available, per_worker) == slots


def test_room_counts_live_nodes_that_are_not_draining() -> None:
    available = {
        "head": {"CPU": 0.0},  # KubeRay's head: num-cpus 0
        "worker-a": {"CPU": 0.0, "CPU_group_x": 1.0},  # holds a worker of the group
        "spare": {"CPU": 1.0},
        "leaving": {"CPU": 1.0},  # a spot notice drained it: it takes no new work
    }
    assert free_worker_slots({"CPU": 1.0}, available, frozenset({"leaving"})) == 1
    assert free_worker_slots({"CPU": 1.0}, available, frozenset({"leaving", "spare"})) == 0


def test_a_worker_asks_for_its_share_of_the_pod() -> None:
    assert worker_resources(WorkerSpec(cpu="2")) == {"CPU": 2.0}
    assert worker_resources(WorkerSpec(cpu="8", gpu=4)) == {"CPU": 2.0, "GPU": 1}


def test_worker_hosts_names_the_idle_spares_and_the_busy_workers_by_pod() -> None:
    def node(node_id: str, host: str, cpu: float, *, alive: bool = True) -> dict[str, object]:
        return {"NodeID": node_id, "NodeManagerHostname": host, "Alive": alive, "Resources": {"CPU": cpu}}

    nodes = [
        node("h", "run-head-x", 0.0),  # the head (num-cpus 0): no worker ever runs there
        node("a", "run-worker-a", 1.0),  # runs the worker: its CPU is in the group's bundle
        node("b", "run-worker-b", 1.0),  # the spare
        node("c", "run-worker-c", 1.0),  # leaving after a notice: neither
        node("d", "run-worker-d", 1.0, alive=False),  # gone
        {"NodeID": "e", "Alive": True, "Resources": {"CPU": 1.0}},  # no hostname: not one a pod is known by
    ]
    available = {"h": {}, "a": {"CPU": 0.0, "CPU_group_x": 1.0}, "b": {"CPU": 1.0}, "c": {"CPU": 1.0}}
    available["e"] = {"CPU": 1.0}
    hosts = worker_hosts({"CPU": 1.0}, nodes, available, frozenset({"c"}))
    assert hosts == WorkerHosts(idle=("run-worker-b",), busy=("run-worker-a",))


def test_a_node_with_part_of_its_room_in_use_is_busy() -> None:
    nodes = [{"NodeID": "a", "NodeManagerHostname": "p", "Alive": True, "Resources": {"CPU": 2.0}}]
    assert worker_hosts({"CPU": 1.0}, nodes, {"a": {"CPU": 1.0}}, frozenset()) == WorkerHosts(busy=("p",))
    assert worker_hosts({"CPU": 1.0}, nodes, {"a": {"CPU": 2.0}}, frozenset()) == WorkerHosts(idle=("p",))
