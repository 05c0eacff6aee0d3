"""An idle spare moved off the node it shares with a training worker (controller/spare_placement.py).

The pure choice (which pod, when, how often), then a whole reconcile over a fake API server and a
real directory store: the run's rank 0 recorded Ray's view in the attempt's progress, the pods
listed show the spare beside the worker, and the controller asks KubeRay to replace the spare.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from spotray.contract.attempts import AttemptId
from spotray.contract.names import SPARE_MOVED_ANNOTATION
from spotray.controller.config import ControllerConfig
from spotray.controller.reconcile import MEMORY, reconcile
from spotray.controller.spare_placement import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    SpareMoved,
    WorkerPod,
    pod_hostname,
    spare_to_move,
    worker_pods,
)
from spotray.train.records.progress_log import AttemptProgress, WorkerHosts
from spotray.train.storage.store import open_store
from tests.unit.test_controller_writes import new_run
from tests.unit.test_ray_cluster_per_run import KeptClusterFake

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UID = "uid-spares"


def seen(idle: set[str], busy: set[str], seconds_ago: float = 5.0) -> WorkerHosts:
    return hosts(idle, busy, NOW - timedelta(seconds=seconds_ago))


def hosts(idle: set[str], busy: set[str], at: datetime) -> WorkerHosts:
    return WorkerHosts(tuple(sorted(idle)), tuple(sorted(busy)), at.timestamp())


BESIDE = [WorkerPod("w-new", "spot-b"), WorkerPod("w-spare", "spot-b")]  # after a reclaim of spot-a


def test_an_idle_spare_beside_a_busy_worker_is_moved() -> None:
    move = spare_to_move(BESIDE, seen({"w-new"}, {"w-spare"}), None, NOW)
    assert move == SpareMoved(pod="w-new", node="spot-b", beside="w-spare", at=NOW, tries=1)


@pytest.mark.parametrize(
    ("pods", "hosts", "why"),
    [
        ([WorkerPod("w-1", "spot-a"), WorkerPod("w-2", "spot-b")], seen({"w-2"}, {"w-1"}), "already apart"),
        (BESIDE, seen({"w-new", "w-spare"}, set()), "nothing trains there: between worker groups"),
        (BESIDE, seen(set(), {"w-spare"}), "the new pod has not joined Ray yet: not known idle"),
        (BESIDE, seen({"w-new"}, {"w-spare"}, seconds_ago=120), "Ray's view is stale"),
        (BESIDE, None, "no view recorded (a job that records none)"),
    ],
)
def test_nothing_moves_without_facts_that_say_so(pods: list[WorkerPod], hosts: WorkerHosts | None, why: str) -> None:
    assert spare_to_move(pods, hosts, None, NOW) is None, why


def test_a_move_waits_for_a_view_newer_than_itself_and_backs_off_while_the_spare_lands_there_again() -> None:
    first = SpareMoved("w-new", "spot-b", "w-spare", NOW, tries=1)
    back = [WorkerPod("w-newer", "spot-b"), WorkerPod("w-spare", "spot-b")]  # no other node had room
    later = NOW + timedelta(seconds=FIRST_BACKOFF_S - 1)
    fresh = hosts({"w-newer"}, {"w-spare"}, later - timedelta(seconds=1))
    assert spare_to_move(back, fresh, first, later) is None, "inside the backoff"
    past = NOW + timedelta(seconds=FIRST_BACKOFF_S + 1)
    stale = hosts({"w-newer"}, {"w-spare"}, NOW - timedelta(seconds=1))
    assert spare_to_move(back, stale, first, past) is None, "a view from before the move says nothing of it"
    fresh = hosts({"w-newer"}, {"w-spare"}, past - timedelta(seconds=1))
    second = spare_to_move(back, fresh, first, past)
    assert second is not None
    assert (second.pod, second.tries) == ("w-newer", 2)
    assert second.backoff == timedelta(seconds=2 * FIRST_BACKOFF_S)
    assert SpareMoved("p", "n", "b", NOW, tries=30).backoff == timedelta(seconds=MAX_BACKOFF_S)
    apart = hosts({"x"}, {"y"}, past)
    elsewhere = spare_to_move([WorkerPod("x", "spot-c"), WorkerPod("y", "spot-c")], apart, first, past)
    assert elsewhere is not None
    assert elsewhere.tries == 1, "another node: a first try"


def test_the_annotation_round_trips_and_an_unreadable_one_waits_on_nothing() -> None:
    move = SpareMoved("w-new", "spot-b", "w-spare", NOW, tries=3)
    assert SpareMoved.from_annotation(move.to_annotation()) == move
    for bad in (None, "", "{", '{"pod": "p"}', '{"pod": "p", "node": "n", "beside": "b", "at": "x", "tries": 1}'):
        assert SpareMoved.from_annotation(bad) is None


def test_only_running_worker_pods_count() -> None:
    def pod(name: str, node_type: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
        labels = {"ray.io/node-type": node_type}
        return {
            "metadata": {"name": name, "labels": labels, **meta},
            "spec": {"nodeName": "n"},
            "status": {"phase": phase},
        }

    listed = [
        pod("head", "head"),
        pod("w-1", "worker"),
        pod("w-2", "worker", "Pending"),
        pod("w-3", "worker", deletionTimestamp="2026-11-30T12:00:00Z"),
        {"metadata": {"name": "submitter", "labels": {}}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}},
    ]
    assert worker_pods(listed) == [WorkerPod("w-1", "n")]


class SparesFake(KeptClusterFake):
    """KeptClusterFake with the run's pods listed and KubeRay's workersToDelete."""

    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__(run)
        self.workers_to_delete: list[tuple[str, str, str]] = []

    def list_attempt_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [p for p in self.pods if labels.items() <= p["metadata"]["labels"].items()]

    def delete_ray_cluster_worker(self, namespace: str, name: str, group: str, pod: str) -> None:
        self.workers_to_delete.append((name, group, pod))


def running_worker(name: str, node: str) -> dict[str, Any]:
    labels = {"spotray.dev/run": "burst", "ray.io/cluster": "burst-c1", "ray.io/node-type": "worker"}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def running_with_spare_beside(
    tmp_path: Path, *, spares: int = 1, per_run: bool = True
) -> tuple[SparesFake, Any, ControllerConfig]:
    """A run whose attempt 1 trains on its spare after a reclaim, KubeRay's new pod beside it, as rank 0 recorded."""
    body = new_run(UID)
    body["spec"]["checkpoint"]["uri"] = f"file://{tmp_path / 'runs' / 'burst'}"
    body["spec"]["workers"] = {"replicas": 1, "spareReplicas": spares}
    fake = SparesFake(body)
    config = ControllerConfig(ray_cluster_per_run=per_run, file_roots=(str(tmp_path / "runs"),))
    reconcile(fake, config, "ns", "burst")  # type: ignore[arg-type]
    fake.set_job("burst-a1", "RUNNING", "Running")
    fake.pods = (running_worker("burst-c1-workers-spare", "spot-b"), running_worker("burst-c1-workers-new", "spot-b"))
    progress = AttemptProgress(attempt=1, run_id=UID, points=[(10, 1.0, datetime.now(UTC).timestamp())])
    progress.worker_hosts = hosts({"burst-c1-workers-new"}, {"burst-c1-workers-spare"}, datetime.now(UTC))
    open_store(body["spec"]["checkpoint"]["uri"]).put_bytes(AttemptId(UID, 1).progress_key, progress.to_json())
    return fake, fake, config


def test_reconcile_moves_the_spare_its_run_named_idle_once_then_backs_off(tmp_path: Path) -> None:
    fake, cluster, config = running_with_spare_beside(tmp_path)
    reconcile(cluster, config, "ns", "burst")
    MEMORY.events.drain()
    assert fake.workers_to_delete == [("burst-c1", "workers", "burst-c1-workers-new")]
    annotation = fake.ray_clusters["burst-c1"]["metadata"]["annotations"][SPARE_MOVED_ANNOTATION]
    moved = SpareMoved.from_annotation(annotation)
    assert moved is not None
    assert (moved.pod, moved.node, moved.beside, moved.tries) == (
        "burst-c1-workers-new",
        "spot-b",
        "burst-c1-workers-spare",
        1,
    )
    assert "event SpareMoved" in fake.calls

    reconcile(cluster, config, "ns", "burst")  # the same view again: it says nothing of the move
    assert len(fake.workers_to_delete) == 1


@pytest.mark.parametrize(("spares", "per_run"), [(0, True), (1, False)])
def test_a_run_without_spares_or_on_a_rayjobs_own_cluster_is_never_moved(
    tmp_path: Path, spares: int, per_run: bool
) -> None:
    fake, cluster, config = running_with_spare_beside(tmp_path, spares=spares, per_run=per_run)
    reconcile(cluster, config, "ns", "burst")
    MEMORY.events.drain()
    assert fake.workers_to_delete == []


def test_a_namesakes_cluster_is_never_touched_and_a_refused_patch_never_fails_the_reconcile(tmp_path: Path) -> None:
    fake, cluster, config = running_with_spare_beside(tmp_path)
    fake.ray_clusters["burst-c1"]["metadata"]["ownerReferences"][0]["uid"] = "another-run"
    reconcile(cluster, config, "ns", "burst")
    assert fake.workers_to_delete == []

    fake, cluster, config = running_with_spare_beside(tmp_path / "refused")

    def refused(namespace: str, name: str, group: str, pod: str) -> None:
        raise ApiException(status=422, reason="the test operation failed")

    fake.delete_ray_cluster_worker = refused  # type: ignore[method-assign]
    reconcile(cluster, config, "ns", "burst")
    MEMORY.events.drain()
    assert SPARE_MOVED_ANNOTATION in fake.ray_clusters["burst-c1"]["metadata"]["annotations"], "the backoff holds"
    assert "event SpareMoved" not in fake.calls


def test_a_long_pod_name_is_matched_by_the_hostname_the_kubelet_gives_it() -> None:
    long_new, long_spare = "r" * 62 + "-workers-worker-abcde", "r" * 62 + "-workers-worker-fghij"
    assert pod_hostname(long_new) == "r" * 62, "cut to 63 bytes, the trailing '-' dropped"
    pods = [WorkerPod("w-new", "spot-b"), WorkerPod(long_spare, "spot-b")]
    move = spare_to_move(pods, seen({"w-new"}, {pod_hostname(long_spare)}), None, NOW)
    assert move is not None
    assert (move.pod, move.beside) == ("w-new", long_spare)
    twins = [WorkerPod(long_new, "spot-b"), WorkerPod(long_spare, "spot-b")]
    assert spare_to_move(twins, seen({"r" * 62}, {"r" * 62}), None, NOW) is None, "one hostname, two pods: unknown"
