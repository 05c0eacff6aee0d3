"""Spare room for a spot notice; which worker pods are idle or busy, as rank 0 records it (ray_capacity.py)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from spotray.contract.spec import WorkerSpec
from spotray.train.hf.progress import WORKER_HOSTS_EVERY_S, ProgressCallback
from spotray.train.launch.ray_capacity import free_worker_slots, slots_on, worker_hosts, worker_resources
from spotray.train.records.event_log import EventLog
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter, WorkerHosts
from spotray.train.storage.store import open_store

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
    hosts = worker_hosts({"CPU": 1.0}, nodes, available, frozenset({"c"}), seen_at=7.0)
    assert hosts == WorkerHosts(idle=("run-worker-b",), busy=("run-worker-a",), time=7.0)


def test_a_node_with_part_of_its_room_in_use_is_busy() -> None:
    nodes = [{"NodeID": "a", "NodeManagerHostname": "p", "Alive": True, "Resources": {"CPU": 2.0}}]
    assert worker_hosts({"CPU": 1.0}, nodes, {"a": {"CPU": 1.0}}, frozenset(), 0.0) == WorkerHosts(busy=("p",))
    assert worker_hosts({"CPU": 1.0}, nodes, {"a": {"CPU": 2.0}}, frozenset(), 0.0) == WorkerHosts(idle=("p",))


def test_rank_0_records_worker_hosts_at_most_every_interval_and_a_failed_read_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("spotray.train.hf.progress.time.monotonic", lambda: clock[0])
    reads: list[WorkerHosts | Exception] = [WorkerHosts(idle=("b",), busy=("a",)), RuntimeError("GCS away")]

    def read() -> WorkerHosts:
        found = reads.pop(0)
        if isinstance(found, Exception):
            raise found
        return found

    writer = ProgressWriter(open_store(str(tmp_path / "ckpt")), AttemptProgress(attempt=1, run_id="r1"), 3600)
    no_stall = SimpleNamespace(upload_stall=None)  # the S3 callback's part here: no stall
    callback = ProgressCallback(no_stall, EventLog(tmp_path / "events.jsonl"), writer, worker_hosts=read)  # type: ignore[arg-type]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    state = TrainerState(global_step=1)
    callback.on_log(args, state, TrainerControl(), logs={"loss": 1.0})
    callback.on_log(args, state, TrainerControl(), logs={"loss": 1.0})  # within the interval: not read
    assert writer.progress.worker_hosts is not None
    assert writer.progress.worker_hosts == WorkerHosts(idle=("b",), busy=("a",))
    assert len(reads) == 1
    clock[0] += WORKER_HOSTS_EVERY_S
    callback.on_log(args, state, TrainerControl(), logs={"loss": 1.0})  # the read fails: logged, training goes on
    assert reads == []
    assert writer.progress.worker_hosts == WorkerHosts(idle=("b",), busy=("a",)), "the last view stays"
    assert writer.close()
