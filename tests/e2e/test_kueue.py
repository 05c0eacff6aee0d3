"""Kueue on the kwok test bed (issue 71): the real Kueue manager (testbed/kueue.py) admits the RayJobs
of TrainingRuns that name a queue. A ClusterQueue with quota for one run: the first run is admitted
and trains on the session's Ray head; the second waits "queued", past its start deadline, spending
no budget, and is admitted when the first ends.

The decisions are unit-tested (tests/unit/test_queue.py); this holds them against Kueue's own
admission. A Kueue eviction of a running run, its preemption and its resume are in
tests/e2e/test_real_pods.py (make test-campaign), where the runs train in real containers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.kueue import Kueue
from tests.e2e.conftest import tb
from tests.e2e.controller_harness import ControllerProcess, training_run
from tests.e2e.test_controller import (  # noqa: F401 - fixtures
    get,
    s3_secret,
    start_controller,
    training_run_crd,
    wait_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

START_DEADLINE_S = 15
CLUSTER_QUEUE = "e2e-one-run"
LOCAL_QUEUE = "team"


@pytest.fixture(scope="session")
def kueue(testbed: tb.Testbed) -> Kueue:
    return Kueue(testbed).start()


@pytest.fixture
def one_run_queue(kueue: Kueue, namespace: str) -> Iterator[str]:
    """A ClusterQueue with quota for one small run (1.5 CPU, 3 GiB) and its LocalQueue in ``namespace``."""
    kueue.cluster_queue(CLUSTER_QUEUE, cpu="2", memory="4Gi")
    kueue.local_queue(namespace, LOCAL_QUEUE, CLUSTER_QUEUE)
    yield LOCAL_QUEUE
    kueue.testbed.kubectl("delete", "localqueue", LOCAL_QUEUE, "-n", namespace, "--wait=false", check=False)
    kueue.testbed.kubectl("delete", "clusterqueue", CLUSTER_QUEUE, "--wait=false", check=False)


def queued_run(name: str, tmp_path: Path, queue: str, max_steps: int) -> dict[str, Any]:
    document = training_run(name, tmp_path, max_steps=max_steps)
    document["spec"]["head"] = {"cpu": "500m", "memory": "1Gi"}
    document["spec"]["workers"] = {"replicas": 1, "cpu": "1", "memory": "2Gi"}
    document["spec"]["queue"] = {"name": queue}
    return document


def admitted(testbed: tb.Testbed, namespace: str, ray_job: str) -> bool:
    found = testbed.kubectl("get", "rayjob", ray_job, "-n", namespace, "-o", "json", check=False)
    # Kueue unsuspends it: KubeRay's type drops suspend: false (omitempty).
    return found.returncode == 0 and not json.loads(found.stdout)["spec"].get("suspend")


def test_a_second_run_waits_queued_spending_nothing_and_is_admitted_when_the_first_ends(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    kueue: Kueue,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture
    one_run_queue: str,
    tmp_path: Path,
) -> None:
    start_controller(SPOTRAY_START_DEADLINE_SECONDS=str(START_DEADLINE_S))
    testbed.apply(queued_run("first", tmp_path, one_run_queue, max_steps=10), namespace=namespace)
    tb.wait_until("Kueue admitted the first run's RayJob", lambda: admitted(testbed, namespace, "first-a1"), 60)
    testbed.apply(queued_run("second", tmp_path, one_run_queue, max_steps=10), namespace=namespace)

    queued = wait_status(testbed, namespace, "second", "queued", lambda s: "queued" in s.get("message", ""), 60)
    assert "LocalQueue team" in queued["message"], queued["message"]
    workloads = {w["metadata"]["ownerReferences"][0]["name"]: w for w in kueue.workloads(namespace)}
    pending = next(c for c in workloads["second-a1"]["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert pending["status"] == "False", pending  # Kueue's own word: no quota for it yet
    # Past its start deadline: still queued, nothing spent (a queue's wait is no failure).
    time.sleep(START_DEADLINE_S + 5)
    status = get(testbed, "trainingrun", "second", namespace)["status"]
    assert status["phase"] == "Pending", status
    assert "queued" in status["message"], status["message"]
    assert (status.get("failures", 0), status.get("preemptions", 0), len(status["attempts"])) == (0, 0, 1), status
    assert not admitted(testbed, namespace, "second-a1")

    first = wait_status(testbed, namespace, "first", "an end", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600)
    assert first["phase"] == "Succeeded", first
    # The first run's RayJob is deleted once judged: its workload gives the quota back.
    tb.wait_until("Kueue admitted the second run's RayJob", lambda: admitted(testbed, namespace, "second-a1"), 90)
    status = wait_status(testbed, namespace, "second", "no longer queued", lambda s: "queued" not in s["message"], 60)
    assert (status.get("failures", 0), status.get("preemptions", 0), status["attempt"]) == (0, 0, 1), status
    # Not left training on the session's Ray head behind the next test.
    testbed.kubectl("delete", "trainingrun", "second", "-n", namespace, "--timeout=60s")
