"""A run without a Secret (pods with their own cloud identity) whose bucket refuses the controller's
unsigned reads: the controller says it cannot read the records and decides from the RayJob alone,
instead of waiting for records it will never be allowed to read (controller/reconcile.py _observe).

Real SeaweedFS (credentials required, so an unsigned request is refused with AccessDenied); the
API server is the fake of tests/unit/test_controller_writes.py, holding a RayJob that failed.
"""

from __future__ import annotations

from typing import Any

import pytest

from spotray.controller.config import ControllerConfig
from spotray.controller.reconcile import reconcile
from spotray.train.storage.local_s3 import LocalS3Server, free_port
from tests.conftest import TEST_BUCKET
from tests.unit.test_controller_writes import FakeCluster, new_run

pytestmark = pytest.mark.integration


def failed_rayjob(body: dict[str, Any], message: str) -> dict[str, Any]:
    body["status"] = {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "message": message}
    return body


def run_to_an_ended_attempt(endpoint: str, uid: str) -> tuple[FakeCluster, ControllerConfig]:
    """A run naming no Secret, its attempt 1 created and then failed (the driver exited 1)."""
    fake = FakeCluster(new_run(uid))
    fake.run["spec"]["checkpoint"] = {"uri": f"s3://{TEST_BUCKET}/no-secret/{uid}"}
    config = ControllerConfig(s3_endpoint=endpoint, settle_seconds=0)
    cluster: Any = fake
    reconcile(cluster, config, "ns", "burst")
    failed_rayjob(fake.rayjobs["burst-a1"], "Job entrypoint command failed with exit code 1, last available logs: boom")
    reconcile(cluster, config, "ns", "burst")
    return fake, config


def test_a_run_without_a_secret_whose_store_refuses_unsigned_reads_is_judged_from_the_rayjob(
    s3_server: LocalS3Server,
) -> None:
    fake, _ = run_to_an_ended_attempt(s3_server.endpoint_url, "uid-refused")
    status = fake.run["status"]
    (attempt,) = status["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "TrainingFailed")
    assert "judged from the RayJob alone" in attempt["message"]
    assert "spec.checkpoint.secretRef" in attempt["message"]
    assert status["failures"] == 1


def test_a_run_without_a_secret_whose_store_does_not_answer_waits_for_it_spending_nothing() -> None:
    fake, _ = run_to_an_ended_attempt(f"http://127.0.0.1:{free_port()}", "uid-unreachable")
    status = fake.run["status"]
    (attempt,) = status["attempts"]
    assert attempt["outcome"] == "Running", "nothing decided while the records may still be read"
    assert status["message"].startswith("WaitingForStorage")
    assert status.get("failures", 0) == 0
