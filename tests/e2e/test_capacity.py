"""Capacity on the kwok test bed (issue 71): the real scheduler cannot place a run's spot workers
(every spot node cordoned, as a spot pool out of capacity leaves them), and the real controller
reads the pods: the run waits past its start deadline spending no budget, says so, and with
``capacity: spot-then-on-demand`` moves its workers to an on-demand node, then back to spot at the
next attempt once spot nodes can take them.

The decisions are unit-tested (tests/unit/test_capacity_waits.py, test_capacity_policy.py); this
holds them against the API server's and the scheduler's own words.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import tb
from tests.e2e.controller_harness import ControllerProcess, training_run
from tests.e2e.test_controller import (  # noqa: F401 - fixtures
    get,
    rayjobs,
    s3_secret,
    start_controller,
    training_run_crd,
    wait_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

START_DEADLINE_S = 15
FALLBACK_AFTER_S = 30


@pytest.fixture
def spot_pool_short(testbed: tb.Testbed) -> Iterator[list[str]]:
    """Every spot node cordoned (Unschedulable, as a spot pool without capacity); uncordoned after."""
    nodes = [node.name for node in testbed.nodes if node.labels.get("spotray.dev/capacity") == "spot"]
    for node in nodes:
        testbed.kubectl("cordon", node)
    try:
        yield nodes
    finally:
        for node in nodes:
            testbed.kubectl("uncordon", node, check=False)


def worker_pods(testbed: tb.Testbed, namespace: str, attempt: int) -> list[dict[str, Any]]:
    selector = f"spotray.dev/attempt={attempt},ray.io/node-type=worker"
    found = testbed.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(found)["items"]
    return pods


def worker_node(testbed: tb.Testbed, namespace: str, attempt: int) -> str:
    """The node the attempt's worker pod is placed on, once the scheduler placed it."""

    def placed() -> str | None:
        pods = worker_pods(testbed, namespace, attempt)
        return next((p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")), None)

    node: str = tb.wait_until(f"attempt {attempt}'s worker placed", placed, timeout=60, interval=1)
    return node


def test_a_run_short_of_spot_capacity_waits_spending_nothing_then_falls_back_to_on_demand_nodes(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture
    spot_pool_short: list[str],
    tmp_path: Path,
) -> None:
    start_controller(SPOTRAY_START_DEADLINE_SECONDS=str(START_DEADLINE_S))
    document = training_run("short", tmp_path, max_steps=10)
    document["spec"]["workers"]["capacity"] = "spot-then-on-demand"
    document["spec"]["workers"]["fallback"] = {"afterWaitSeconds": FALLBACK_AFTER_S}
    document["spec"]["retry"] = {"maxFailures": 0, "backoffSeconds": 1}
    testbed.apply(document, namespace=namespace)

    waiting = wait_status(
        testbed,
        namespace,
        "short",
        "waiting for capacity",
        lambda s: "waiting for capacity" in s.get("message", ""),
        60,
    )
    assert "were unschedulable" in waiting["message"], waiting["message"]  # the scheduler's own words
    assert waiting["attempts"][0]["capacity"] == "spot"
    assert waiting["attempts"][0]["capacityWaitSince"]
    condition = next(c for c in waiting["conditions"] if c["type"] == "WaitingForCapacity")
    assert condition["status"] == "True"
    # Past the start deadline: still waiting, nothing spent (it used to end StartDeadlineExceeded).
    time.sleep(START_DEADLINE_S + 5)
    status = get(testbed, "trainingrun", "short", namespace)["status"]
    assert status["phase"] == "Pending", status
    assert status.get("failures", 0) == 0, status
    assert len(status["attempts"]) == 1, status["attempts"]

    status = wait_status(testbed, namespace, "short", "attempt 2", lambda s: s.get("attempt") == 2, 90)
    first, second = status["attempts"]
    assert (first["outcome"], first["reason"]) == ("Interrupted", "CapacityFallback"), first
    assert second["capacity"] == "on-demand", second
    assert status.get("failures", 0) == 0
    assert rayjobs(testbed, namespace, "short") == ["short-a2"], "the spot attempt's RayJob gave its place up"

    node = worker_node(testbed, namespace, 2)
    assert node not in spot_pool_short, node
    labels = json.loads(testbed.kubectl("get", "node", node, "-o", "json").stdout)["metadata"]["labels"]
    assert labels["spotray.dev/capacity"] == "on-demand"


# Four minutes (two trainings on the local Ray head): the decisions are in make test as unit tests
# (tests/unit/test_capacity_policy.py), and the fall back itself by the test above.
@pytest.mark.campaign
def test_a_run_that_fell_back_to_on_demand_returns_to_spot_at_its_next_attempt_and_succeeds(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture
    spot_pool_short: list[str],
    tmp_path: Path,
) -> None:
    prices = '{"currency": "USD", "spotPerHour": 1.0, "onDemandPerHour": 3.0}'
    start_controller(SPOTRAY_START_DEADLINE_SECONDS=str(START_DEADLINE_S), SPOTRAY_PRICES=prices)
    document = training_run("back", tmp_path, max_steps=120)
    document["spec"]["workers"]["capacity"] = "spot-then-on-demand"
    document["spec"]["workers"]["fallback"] = {"afterWaitSeconds": FALLBACK_AFTER_S}
    testbed.apply(document, namespace=namespace)
    wait_status(testbed, namespace, "back", "attempt 2 past a checkpoint", lambda s: s.get("attempt") == 2
                and "lastCheckpoint" in s, 600)  # fmt: skip
    on_demand_node = worker_node(testbed, namespace, 2)
    job = get(testbed, "rayjob", "back-a2", namespace)

    # Spot capacity is back; the on-demand node is lost (an attempt boundary), and the next attempt
    # goes back to spot nodes.
    for node in spot_pool_short:
        testbed.kubectl("uncordon", node)
    testbed.preempt_node(on_demand_node)
    try:
        assert ray_head.kill_job(job["status"]["jobId"])
        status = wait_status(testbed, namespace, "back", "attempt 3", lambda s: s.get("attempt") == 3, 120)
    finally:
        testbed.restore_node(on_demand_node)
    assert status["attempts"][2]["capacity"] == "spot", status["attempts"]

    assert worker_node(testbed, namespace, 3) in spot_pool_short
    status = wait_status(
        testbed, namespace, "back", "Succeeded", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600
    )
    assert status["phase"] == "Succeeded", status
    assert [a["capacity"] for a in status["attempts"]] == ["spot", "on-demand", "spot"]
    assert [a["reason"] for a in status["attempts"][:2]] == ["CapacityFallback", "NodeLost"]
    assert status.get("failures", 0) == 0
    assert status["cost"]["onDemandSeconds"] > 0, status["cost"]
