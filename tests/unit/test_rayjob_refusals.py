"""A RayJob that the API server or KubeRay refuses: bad content fails the run at once with the words
that say why; a quota, a policy or a failing server is tried again with the reason in the status
until the start deadline; nothing waits for ever with "attempt N starting" (spotray/decisions/run_plan.py
``rayjob_refused``, ``_validation_failed``; controller/rayjob.py ``size_refusal``, ``secret_env_refusal``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from spotray.contract.status import format_date_time
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import RayJobRefusedError, refusal_of
from spotray.controller.rayjob import MAX_RAYJOB_BYTES, build_ray_cluster, build_rayjob, size_refusal
from spotray.controller.reconcile import MEMORY, reconcile
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.vocabulary import RayJobRefusal
from tests.lifecycle_runs import NOW, run
from tests.lifecycle_runs import planned as plan
from tests.unit.test_controller_writes import FakeCluster, new_run
from tests.unit.test_lifecycle import started

pytestmark = pytest.mark.unit

QUOTA = RayJobRefusal(
    403,
    "Forbidden",
    'rayjobs.ray.io "burst-a1" is forbidden: exceeded quota: no-rayjobs, requested: count/rayjobs.ray.io=1, '
    "used: count/rayjobs.ray.io=0, limited: count/rayjobs.ray.io=0",
)
SCHEMA = RayJobRefusal(422, "Invalid", 'RayJob.ray.io "burst-a1" is invalid: spec.entrypoint: Invalid value')


@pytest.mark.parametrize(
    ("refusal", "content"),
    [
        (QUOTA, False),
        (SCHEMA, True),
        (RayJobRefusal(413, "RequestEntityTooLarge", "the request is too large"), True),
        (RayJobRefusal(500, "InternalError", "etcdserver: request is too large"), True),
        (RayJobRefusal(400, "BadRequest", "the object could not be decoded"), True),
        # A ValidatingAdmissionPolicy answers 422 Invalid by default, a webhook 403 or what it chose:
        # an administrator's rule, which may change, not the spec's fault.
        (
            RayJobRefusal(
                422,
                "Invalid",
                "rayjobs.ray.io \"x\" is forbidden: ValidatingAdmissionPolicy 'no-rayjobs' with binding "
                "'no-rayjobs' denied request: not here",
            ),
            False,
        ),
        (RayJobRefusal(400, "BadRequest", 'admission webhook "deny.example.com" denied the request: no'), False),
        (RayJobRefusal(500, "InternalError", 'failed calling webhook "x": context deadline exceeded'), False),
        (RayJobRefusal(429, "TooManyRequests", "too many requests"), False),
        (RayJobRefusal(503, "ServiceUnavailable", "etcd leader changed"), False),
    ],
)
def test_only_a_refused_content_is_bad_input(refusal: RayJobRefusal, content: bool) -> None:
    assert refusal.content_is_cause is content


def test_the_api_servers_status_is_read_from_its_answer() -> None:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "reason": "Forbidden", "message": QUOTA.message})
    assert refusal_of(error) == QUOTA
    garbled = ApiException(status=500, reason="Internal Server Error")
    garbled.body = "<html>proxy error</html>"
    assert refusal_of(garbled) == RayJobRefusal(500, "Internal Server Error", "<html>proxy error</html>")


class RefusingCluster(FakeCluster):
    """The fake API server of test_controller_writes, refusing every RayJob create with ``refusal``
    while it is set (a quota that is later lifted, a policy later changed)."""

    def __init__(self, body: dict[str, Any], refusal: RayJobRefusal | None) -> None:
        super().__init__(body)
        self.refusal = refusal

    def create_rayjob(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if self.refusal is not None:
            self.calls.append(f"refused {body['metadata']['name']}")
            raise RayJobRefusedError(self.refusal)
        return super().create_rayjob(body)

    def events(self) -> list[str]:
        MEMORY.events.drain()
        return [call.removeprefix("event ") for call in self.calls if call.startswith("event ")]


def test_a_quota_refusal_keeps_the_attempt_pending_with_the_reason_then_the_same_attempt_starts() -> None:
    fake = RefusingCluster(new_run("uid-quota-1"), QUOTA)
    cluster: Any = fake
    again = reconcile(cluster, ControllerConfig(), "ns", "burst")
    assert again is not None
    assert 5.0 <= again <= 60.0, "tried again, neither at once nor for ever later"
    status = fake.run["status"]
    assert status["phase"] == "Pending"
    assert [(a["attempt"], a["outcome"]) for a in status["attempts"]] == [(1, "Running")]
    assert "exceeded quota: no-rayjobs" in status["message"]
    assert "start deadline" in status["message"]
    assert "RayJobRefused" in fake.events()
    assert (status.get("failures", 0), status.get("preemptions", 0)) == (0, 0)

    reconcile(cluster, ControllerConfig(), "ns", "burst")  # still refused: nothing new recorded
    assert [a["attempt"] for a in fake.run["status"]["attempts"]] == [1]

    fake.refusal = None  # the quota is lifted
    reconcile(cluster, ControllerConfig(), "ns", "burst")
    assert list(fake.rayjobs) == ["burst-a1"], "the attempt recorded is the one created: no attempt 2"
    assert [a["attempt"] for a in fake.run["status"]["attempts"]] == [1]


def test_a_rayjob_refused_until_the_start_deadline_ends_its_attempt_as_a_failure() -> None:
    fake = RefusingCluster(new_run("uid-quota-2"), QUOTA)
    cluster: Any = fake
    fake.run["spec"]["retry"] = {"maxFailures": 0}
    config = ControllerConfig(start_deadline_seconds=60)
    reconcile(cluster, config, "ns", "burst")
    # The attempt began two minutes ago, as far as the status says.
    fake.run["status"]["attempts"][0]["startTime"] = format_date_time(datetime.now(UTC) - timedelta(minutes=2))
    reconcile(cluster, config, "ns", "burst")
    status = fake.run["status"]
    (attempt,) = status["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "StartDeadlineExceeded")
    assert "never created" in attempt["message"]
    assert "exceeded quota" in attempt["message"], "the last refusal is named"
    assert status["phase"] == "Failed"


def test_a_refused_content_fails_the_run_at_once_with_the_servers_words() -> None:
    fake = RefusingCluster(new_run("uid-schema"), SCHEMA)
    cluster: Any = fake
    assert reconcile(cluster, ControllerConfig(), "ns", "burst") is None
    status = fake.run["status"]
    assert status["phase"] == "Failed"
    (attempt,) = status["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "BadInput")
    assert "spec.entrypoint: Invalid value" in status["message"]
    assert "BadInput" in fake.events()
    assert fake.calls.count("refused burst-a1") == 1


def test_a_rayjob_too_large_for_the_api_server_is_refused_before_asking_with_its_size() -> None:
    fake = RefusingCluster(new_run("uid-large"), None)
    fake.run["spec"]["runtimeEnv"] = {"env_vars": {"BLOB": "x" * (MAX_RAYJOB_BYTES // 2 + 1000)}}
    cluster: Any = fake
    reconcile(cluster, ControllerConfig(submission_mode="HTTPMode"), "ns", "burst")  # no submitter's argument
    status = fake.run["status"]
    assert status["phase"] == "Failed"
    assert "bytes, over the 1048576" in status["message"]
    assert "was not sent to the API server" in status["message"]
    assert "spec.runtimeEnv" in status["message"]
    assert not any(call.startswith("create") for call in fake.calls), "never sent"


def test_a_run_with_secret_env_on_the_long_lived_ray_cluster_fails_at_once_never_sent() -> None:
    """The chart's RayCluster started its pods without the run's Secrets: the job would run without them."""
    fake = RefusingCluster(new_run("uid-secret-env"), None)
    fake.run["spec"]["secretEnv"] = {"HF_TOKEN": "hf-token/token"}
    cluster: Any = fake
    reconcile(cluster, ControllerConfig(ray_cluster_selector={"ray.io/cluster": "shared"}), "ns", "burst")
    status = fake.run["status"]
    assert status["phase"] == "Failed"
    assert status["attempts"][0]["reason"] == "BadInput"
    assert "spec.secretEnv (HF_TOKEN) reaches only the pods of a Ray cluster of the run's own" in status["message"]
    assert not any(call.startswith("create") for call in fake.calls), "never sent"


def test_a_rayjob_well_within_the_size_passes_the_check() -> None:
    body = build_rayjob(run(), 1, "uid", ControllerConfig())
    assert size_refusal(body) is None
    assert size_refusal(body, limit=100) is not None


def test_a_runs_ray_cluster_over_the_size_is_refused_by_its_own_kind() -> None:
    made = build_ray_cluster(run(), "r-c1", "uid", ControllerConfig(ray_cluster_per_run=True))
    assert size_refusal(made) is None
    refused = size_refusal(made, limit=100)
    assert refused is not None
    assert refused.message.startswith("the RayCluster would be ")
    assert "runtime env" not in refused.message


def test_kuberays_validation_failed_fails_the_run_at_once_and_deletes_the_rayjob() -> None:
    refused = RayJobView(
        job_status=None,
        deployment_status="ValidationFailed",
        message="RayJob name should be no more than 47 characters",
    )
    observation = Observation(run(), started(), refused, start_deadline_seconds=900)
    result = plan(observation, NOW + timedelta(seconds=5))
    assert result.state.phase == "Failed"
    assert result.state.failure_reason == "BadInput"
    assert "KubeRay refused RayJob r-a1 (ValidationFailed): RayJob name should be no more" in result.state.message
    assert result.delete_rayjob == "r-a1"
    assert [event.reason for event in result.events] == ["BadInput"]


def test_a_runtime_env_too_long_for_one_argument_of_the_submitter_is_refused_before_asking() -> None:
    """K8sJobMode passes the runtime env to the submitter as one argument: Linux starts no process
    with one of 128 KiB or more, so the pod would never start and the attempt wait out its deadline."""
    # The runtime env holds the blob twice: in env_vars, and in SPOTRAY_RUN's copy of the spec.
    fits = build_rayjob(run(runtimeEnv={"env_vars": {"BLOB": "x" * 50_000}}), 1, "uid", ControllerConfig())
    assert size_refusal(fits) is None
    large = build_rayjob(run(runtimeEnv={"env_vars": {"BLOB": "x" * 70_000}}), 1, "uid", ControllerConfig())
    refused = size_refusal(large)
    assert refused is not None
    assert refused.content_is_cause
    assert "argument of" in refused.message
    http = build_rayjob(
        run(runtimeEnv={"env_vars": {"BLOB": "x" * 70_000}}), 1, "uid", ControllerConfig(submission_mode="HTTPMode")
    )
    assert size_refusal(http) is None, "no submitter pod in HTTPMode"
