"""A spot node lost while the controller was down: the attempt's end is judged from what is left
(the pods still there, the scheduler's Scheduled Events, the Nodes), not as a training failure
because the pod watch was not running (controller/reconcile.py ``_node_loss_read_back``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotray.controller.config import ControllerConfig
from spotray.controller.disruptions import node_loss_note, scheduled_nodes
from spotray.controller.reconcile import reconcile
from tests.unit.test_controller_writes import FakeCluster, new_run

pytestmark = pytest.mark.unit
PLACED = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def scheduled(pod: str, node: str, at: datetime = PLACED) -> dict[str, Any]:
    """A core/v1 Event as the scheduler writes it (events.k8s.io: eventTime set, firstTimestamp not)."""
    return {
        "reason": "Scheduled",
        "involvedObject": {"kind": "Pod", "name": pod},
        "message": f"Successfully assigned ns/{pod} to {node}",
        "eventTime": at.isoformat().replace("+00:00", "Z"),
    }


def test_the_nodes_of_a_rayjobs_pods_are_read_from_the_scheduler_and_the_pods_left() -> None:
    events = [
        scheduled("burst-a1-x7k2p-head-abcde", "on-demand-0"),
        scheduled("burst-a1-x7k2p-cpu-worker-fghij", "spot-1"),
        scheduled("burst-a10-q8w1e-head-zzzzz", "spot-9"),  # attempt 10's, not attempt 1's
        {"reason": "Scheduled", "involvedObject": {"name": "burst-a1-x"}, "message": "garbled"},
    ]
    pods = [{"metadata": {"name": "burst-a1-x7k2p-cpu-worker-new01"}, "spec": {"nodeName": "spot-2"}}]
    placed = scheduled_nodes(pods, events, "burst-a1")
    assert placed == {
        "on-demand-0": ("burst-a1-x7k2p-head-abcde", PLACED),
        "spot-1": ("burst-a1-x7k2p-cpu-worker-fghij", PLACED),
        "spot-2": ("burst-a1-x7k2p-cpu-worker-new01", None),
    }


def test_a_node_gone_or_made_anew_since_is_a_loss_and_one_still_there_is_not() -> None:
    placed = {"on-demand-0": ("head", PLACED), "spot-1": ("worker", PLACED)}
    assert node_loss_note(placed, {"on-demand-0": PLACED - timedelta(days=1), "spot-1": PLACED}) is None
    gone = node_loss_note(placed, {"on-demand-0": PLACED - timedelta(days=1), "spot-1": None})
    assert gone is not None
    assert gone.startswith("pod worker on node spot-1: the node no longer exists")
    anew = node_loss_note(placed, {"on-demand-0": PLACED, "spot-1": PLACED + timedelta(minutes=3)})
    assert anew is not None
    assert "created anew" in anew


def failed_attempt(fake: FakeCluster, store: Path) -> dict[str, Any]:
    """Attempt 1 of the fake's run created, then its RayJob failed (the driver exited 1); its records
    (none) in a directory store."""
    fake.run["spec"]["checkpoint"] = {"uri": f"file://{store}"}
    cluster: Any = fake
    config = ControllerConfig(settle_seconds=0, file_roots=(str(store.parent),))
    reconcile(cluster, config, "ns", "burst")
    fake.rayjobs["burst-a1"]["status"] = {
        "jobStatus": "FAILED",
        "jobDeploymentStatus": "Failed",
        "message": "Job entrypoint command failed with exit code 1",
        "endTime": (datetime.now(UTC) - timedelta(minutes=1)).isoformat().replace("+00:00", "Z"),
    }
    reconcile(cluster, config, "ns", "burst")
    attempt: dict[str, Any] = fake.run["status"]["attempts"][0]
    return attempt


def test_a_spot_node_lost_while_the_controller_was_down_is_a_preemption_not_a_failure(tmp_path: Path) -> None:
    fake = FakeCluster(new_run("uid-node-lost"))
    fake.scheduled = (scheduled("burst-a1-x7k2p-cpu-worker-fghij", "spot-1"),)
    fake.nodes = (("on-demand-0", PLACED - timedelta(days=1)),)  # spot-1 is gone
    attempt = failed_attempt(fake, tmp_path)
    assert (attempt["outcome"], attempt["reason"]) == ("Preempted", "NodeLost")
    assert "spot-1" in attempt["message"]
    assert "read back" in attempt["message"]
    assert fake.run["status"].get("failures", 0) == 0


def test_a_pod_left_with_a_disruption_condition_nobody_watched_is_read_back(tmp_path: Path) -> None:
    fake = FakeCluster(new_run("uid-pod-left"))
    fake.pods = (
        {
            "metadata": {"name": "burst-a1-x7k2p-cpu-worker-fghij"},
            "spec": {"nodeName": "spot-1"},
            "status": {
                "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]
            },
        },
    )
    fake.nodes = (("spot-1", PLACED),)
    attempt = failed_attempt(fake, tmp_path)
    assert (attempt["outcome"], attempt["reason"]) == ("Preempted", "NodeLost")
    assert "DeletionByTaintManager" in attempt["message"]


def test_a_failure_on_nodes_that_are_all_still_there_spends_the_failure_budget(tmp_path: Path) -> None:
    fake = FakeCluster(new_run("uid-code-failed"))
    fake.scheduled = (scheduled("burst-a1-x7k2p-cpu-worker-fghij", "spot-1"),)
    fake.nodes = (("spot-1", PLACED - timedelta(hours=1)),)
    attempt = failed_attempt(fake, tmp_path)
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "TrainingFailed")
