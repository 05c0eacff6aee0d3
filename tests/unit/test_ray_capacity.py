"""Spare room for a spot notice: how many more workers Ray could place now (train/launch/ray_capacity.py)."""

import pytest

from spotray.contract.spec import WorkerSpec
from spotray.train.launch.ray_capacity import free_worker_slots, slots_on, worker_resources

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
