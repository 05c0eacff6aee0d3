"""One RayCluster per run, kept across its attempts (issue 39, item 1: controller ``ray_cluster_per_run``).

The builders (the run's cluster; a RayJob that names it); the choice of the next attempt's cluster
(kept, or the next generation when its head was lost or it is gone; a namesake's never deleted);
then whole runs through the controller's reconcile over a fake API server and a real directory
store: a lost spot worker keeps the cluster, a lost head ends the attempt at once (KubeRay would
wait 300 s) and starts the next on a new generation, and the cluster goes when the run ends.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.errors import SpotrayError
from spotray.contract.names import HEAD_LOST_ANNOTATION
from spotray.contract.spec import RunContext, parse_training_run
from spotray.contract.status import format_date_time
from spotray.controller.config import ControllerConfig
from spotray.controller.disruptions import record_cluster_pod_disrupted
from spotray.controller.rayjob import build_ray_cluster, build_rayjob, ray_cluster_shape
from spotray.controller.reconcile import MEMORY, reconcile
from spotray.decisions.observation import Observation, RayClusterView, RayJobView
from spotray.decisions.ray_cluster import next_ray_cluster
from spotray.decisions.run_state import RunState
from tests.lifecycle_runs import planned as plan_of
from tests.unit.test_controller_writes import FakeCluster, new_run

pytestmark = pytest.mark.unit
UID = "uid-kept"
PER_RUN = ControllerConfig(ray_cluster_per_run=True)


def test_the_runs_cluster_has_no_attempt_and_each_rayjob_names_it() -> None:
    run = parse_training_run(new_run(UID))
    cluster = build_ray_cluster(run, "burst-c1", UID, PER_RUN)
    assert cluster["kind"] == "RayCluster"
    assert cluster["metadata"]["name"] == "burst-c1"
    assert cluster["metadata"]["ownerReferences"][0]["uid"] == UID
    templates = [cluster["spec"]["headGroupSpec"]["template"], cluster["spec"]["workerGroupSpecs"][0]["template"]]
    for labels in [cluster["metadata"]["labels"], *(t["metadata"]["labels"] for t in templates)]:
        assert labels["spotray.dev/run"] == "burst"
        assert "spotray.dev/attempt" not in labels, "its pods outlive any one attempt"
    job = build_rayjob(run, 2, UID, PER_RUN, ray_cluster="burst-c1")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "burst-c1"}
    for key in ("rayClusterSpec", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished"):
        assert key not in job["spec"]
    assert job["metadata"]["labels"]["spotray.dev/attempt"] == "2"
    assert job["spec"]["submitterPodTemplate"]["metadata"]["labels"]["spotray.dev/attempt"] == "2"
    # The same head and workers as a RayJob's own cluster, but for the labels.
    own = build_rayjob(run, 2, UID, ControllerConfig())["spec"]["rayClusterSpec"]
    assert json.dumps(own).replace('"spotray.dev/attempt": "2", ', "") == json.dumps(cluster["spec"])


def observation(last: str | None, seen: RayClusterView | None) -> Observation:
    run = parse_training_run(new_run(UID))
    status = {"attempts": [{"attempt": 1, "rayJob": "burst-a1", "outcome": "Preempted", "rayCluster": last}]}
    state = RunState.from_status(status if last else {}, "burst")
    return Observation(run, state, None, run_uid=UID, ray_cluster_per_run=True, ray_cluster=seen)


def test_the_next_attempt_keeps_the_cluster_unless_its_head_was_lost_or_it_is_gone() -> None:
    assert next_ray_cluster(observation(None, None), "spot") == ("burst-c1", None)
    assert next_ray_cluster(observation("burst-c1", RayClusterView("burst-c1", owner_uid=UID)), "spot") == (
        "burst-c1",
        None,
    )
    lost = RayClusterView("burst-c1", head_lost="pod burst-c1-head on node n1: DeletionByTaintManager", owner_uid=UID)
    assert next_ray_cluster(observation("burst-c1", lost), "spot") == ("burst-c2", "burst-c1")
    assert next_ray_cluster(observation("burst-c7", None), "spot") == ("burst-c8", None), "gone: nothing to delete"
    namesake = RayClusterView("burst-c1", owner_uid="another-run")
    assert next_ray_cluster(observation("burst-c1", namesake), "spot") == ("burst-c2", None), "never delete another's"
    off = Observation(parse_training_run(new_run(UID)), RunState(), None, run_uid=UID)
    assert next_ray_cluster(off, "spot") == (None, None)


class KeptClusterFake(FakeCluster):
    """FakeCluster with RayClusters, annotations and pods."""

    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__(run)
        self.ray_clusters: dict[str, dict[str, Any]] = {}

    def get_ray_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.ray_clusters.get(name)

    def create_ray_cluster(self, body: dict[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        if name in self.ray_clusters:
            return self.ray_clusters[name]
        self.calls.append(f"create {name}")
        self.ray_clusters[name] = body
        return None

    def delete_ray_cluster(self, namespace: str, name: str) -> None:
        self.calls.append(f"delete {name}")
        self.ray_clusters.pop(name, None)

    def annotate_ray_cluster(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.ray_clusters[name]["metadata"].setdefault("annotations", {}).update(annotations)

    def annotate_rayjob(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.rayjobs[name]["metadata"].setdefault("annotations", {}).update(annotations)

    def set_job(self, name: str, job_status: str, deployment: str, ended: datetime | None = None) -> None:
        status = {"jobStatus": job_status, "jobDeploymentStatus": deployment}
        self.rayjobs[name]["status"] = status | ({"endTime": format_date_time(ended)} if ended else {})


def kept_run(
    tmp_path: Path, retry: dict[str, Any] | None = None, **config: Any
) -> tuple[KeptClusterFake, ControllerConfig]:
    """The run "burst" on a directory store under ``tmp_path``, with a cluster per run (and ``config``)."""
    body = new_run(UID)
    body["spec"]["checkpoint"]["uri"] = f"file://{tmp_path / 'runs' / 'burst'}"
    if retry is not None:
        body["spec"]["retry"] = retry
    settings = ControllerConfig(ray_cluster_per_run=True, file_roots=(str(tmp_path / "runs"),), **config)
    return KeptClusterFake(body), settings


def disrupted_pod(name: str, node_type: str, ray_cluster: str, when: datetime) -> dict[str, Any]:
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "lastTransitionTime": format_date_time(when),
    }
    labels = {"spotray.dev/run": "burst", "ray.io/cluster": ray_cluster, "ray.io/node-type": node_type}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"nodeName": f"node-of-{name}"},
        "status": {"conditions": [condition]},
    }


def test_a_lost_worker_keeps_the_cluster_a_lost_head_starts_a_new_one_and_the_run_deletes_it(tmp_path: Path) -> None:
    fake, config = kept_run(tmp_path, {"backoffSeconds": 0}, settle_seconds=0)
    cluster: Any = fake
    long_ago = datetime.now(UTC) - timedelta(minutes=5)

    reconcile(cluster, config, "ns", "burst")
    assert fake.calls[:2] == ["create burst-c1", "create burst-a1"], "the cluster before the RayJob that names it"
    assert fake.rayjobs["burst-a1"]["spec"]["clusterSelector"] == {"ray.io/cluster": "burst-c1"}
    assert fake.run["status"]["attempts"][0]["rayCluster"] == "burst-c1"

    # A spot worker is reclaimed: the job fails without it, and the pod watcher said why.
    fake.set_job("burst-a1", "RUNNING", "Running")
    worker = disrupted_pod("burst-c1-workers-x", "worker", "burst-c1", long_ago)
    assert record_cluster_pod_disrupted(cluster, worker, datetime.now(UTC)) == "burst"
    fake.set_job("burst-a1", "FAILED", "Failed", ended=long_ago)
    reconcile(cluster, config, "ns", "burst")  # the attempt's end
    reconcile(cluster, config, "ns", "burst")  # the next attempt, past its backoff (0 s)
    first, second = fake.run["status"]["attempts"]
    assert (first["outcome"], first["reason"]) == ("Preempted", "NodeLost")
    assert second["rayCluster"] == "burst-c1", "the head survived: the next attempt runs on the same cluster"
    assert "delete burst-c1" not in fake.calls
    assert "burst-a1" not in fake.rayjobs, "the preempted attempt's RayJob goes (its Ray job stopped)"
    assert fake.rayjobs["burst-a2"]["spec"]["clusterSelector"] == {"ray.io/cluster": "burst-c1"}

    # The head's node is lost: KubeRay would leave the RayJob Running for 300 s; the attempt ends now.
    fake.set_job("burst-a2", "RUNNING", "Running")
    head = disrupted_pod("burst-c1-head", "head", "burst-c1", datetime.now(UTC))
    record_cluster_pod_disrupted(cluster, head, datetime.now(UTC))
    assert HEAD_LOST_ANNOTATION in fake.ray_clusters["burst-c1"]["metadata"]["annotations"]
    reconcile(cluster, config, "ns", "burst")
    assert fake.run["status"]["attempts"][1]["outcome"] == "Preempted"
    reconcile(cluster, config, "ns", "burst")
    second = fake.run["status"]["attempts"][1]
    assert (second["outcome"], second["reason"]) == ("Preempted", "NodeLost")
    assert "the Ray head's pod burst-c1-head" in second["message"]
    assert fake.run["status"]["preemptions"] == 2
    third = fake.run["status"]["attempts"][2]
    assert third["rayCluster"] == "burst-c2"
    assert "burst-c1" not in fake.ray_clusters
    assert "burst-c2" in fake.ray_clusters
    assert fake.calls.index("create burst-c2") < fake.calls.index("create burst-a3")

    # Ray says SUCCEEDED while KubeRay's submitter still follows the driver's log (the RayJob is
    # Running until it exits): the run ends now, and its last RayJob goes with the cluster, or the
    # submitter would lose its head and retry into pods that cannot start (the cluster's token is gone).
    fake.set_job("burst-a3", "SUCCEEDED", "Running", ended=long_ago)
    reconcile(cluster, config, "ns", "burst")
    MEMORY.events.drain()
    assert fake.run["status"]["phase"] == "Succeeded"
    assert fake.ray_clusters == {}, "the run's cluster goes when the run ends"
    assert fake.rayjobs == {}, "and its last RayJob with it"
    assert fake.calls.index("delete burst-a3") < fake.calls.index("delete burst-c2")


def test_a_suspended_run_deletes_its_cluster_and_resumes_on_a_new_one(tmp_path: Path) -> None:
    fake, config = kept_run(tmp_path)
    cluster: Any = fake
    reconcile(cluster, config, "ns", "burst")
    fake.set_job("burst-a1", "RUNNING", "Running")
    fake.run["spec"]["suspend"] = True
    reconcile(cluster, config, "ns", "burst")
    assert fake.run["status"]["phase"] == "Suspended"
    # The cluster goes first: its pods' preStop hooks drain their nodes, the workers take an emergency
    # checkpoint and the driver records it. Deleting the RayJob would stop its driver at once, and the
    # workers with it, before any checkpoint (issue #69).
    assert fake.ray_clusters == {}
    assert set(fake.rayjobs) == {"burst-a1"}
    fake.set_job("burst-a1", "FAILED", "Failed", ended=datetime.now(UTC))  # the driver recorded it and ended
    reconcile(cluster, config, "ns", "burst")
    assert fake.rayjobs == {}
    fake.run["spec"]["suspend"] = False
    reconcile(cluster, config, "ns", "burst")
    assert fake.run["status"]["attempts"][-1]["rayCluster"] == "burst-c2"
    assert set(fake.ray_clusters) == {"burst-c2"}


def test_a_job_on_a_cluster_that_outlives_its_attempt_is_told_so() -> None:
    """Its driver's SIGTERM (the job stopped: its RayJob deleted, the run suspended) then drains no
    node (train/launch/launcher.py ``install_driver_sigterm``): a drained node never takes work again,
    and the kept cluster, or the chart's long-lived one, serves later attempts and other runs."""
    run = parse_training_run(new_run(UID))

    def context(job: dict[str, Any]) -> RunContext:
        read = RunContext.from_env(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"])
        assert read is not None
        return read

    assert context(build_rayjob(run, 2, UID, PER_RUN, ray_cluster="burst-c1")).ray_cluster_outlives_attempt
    long_lived = ControllerConfig(ray_cluster_selector={"ray.io/cluster": "spotray-shared"})
    assert context(build_rayjob(run, 2, UID, long_lived)).ray_cluster_outlives_attempt
    own = build_rayjob(run, 2, UID, ControllerConfig())
    assert not context(own).ray_cluster_outlives_attempt
    assert "rayClusterOutlivesAttempt" not in own["spec"]["runtimeEnvYAML"], "absent unless true"


def test_a_cluster_that_ended_two_attempts_in_a_row_by_infrastructure_faults_is_replaced() -> None:
    """Real pods, --ray-cluster-per-run: a kept cluster whose nodes a stopped driver had drained failed
    attempts 2-6 at once ("Job supervisor actor could not be scheduled", Interrupted, nothing spent),
    and the run waited on it for ever. Whatever breaks a kept cluster, two such attempts in a row on
    it give the next attempt a new one."""
    run = parse_training_run(new_run(UID))
    seen = RayClusterView("burst-c1", owner_uid=UID)

    def after(*ended: tuple[str, str]) -> tuple[str | None, str | None]:
        attempts = [
            {"attempt": n, "rayJob": f"burst-a{n}", "outcome": outcome, "rayCluster": cluster}
            for n, (outcome, cluster) in enumerate(ended, start=1)
        ]
        state = RunState.from_status({"attempts": attempts}, "burst")
        return next_ray_cluster(
            Observation(run, state, None, run_uid=UID, ray_cluster_per_run=True, ray_cluster=seen), "spot"
        )

    assert after(("Interrupted", "burst-c1")) == ("burst-c1", None), "one fault (an S3 blip) keeps it"
    assert after(("Interrupted", "burst-c1"), ("Interrupted", "burst-c1")) == ("burst-c2", "burst-c1")
    assert after(("Preempted", "burst-c1"), ("Interrupted", "burst-c1")) == ("burst-c1", None)
    assert after(("Interrupted", "burst-c0"), ("Interrupted", "burst-c1")) == ("burst-c1", None), "one on this one"


def test_a_kept_cluster_whose_shape_the_spec_no_longer_makes_is_replaced_at_the_next_attempt(tmp_path: Path) -> None:
    """Issue #69, item 4: the kept RayCluster was reused by name whatever the spec said now, so an edited
    image was silently ignored, and more workers or GPUs left the next driver waiting for a worker group
    the pods could not hold, retried by Ray Train for ever while the RayJob stayed Running."""
    fake, config = kept_run(tmp_path, {"backoffSeconds": 0}, settle_seconds=0)
    cluster: Any = fake
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    events: list[str] = []
    fake.post_event = lambda _run, event, _now: events.append(event.message)  # type: ignore[method-assign,assignment]
    reconcile(cluster, config, "ns", "burst")
    made = fake.ray_clusters["burst-c1"]
    assert made["metadata"]["annotations"]["spotray.dev/shape"] == ray_cluster_shape(
        parse_training_run(fake.run), config
    )

    # The user edits the spec mid-attempt: the running attempt goes on, on the cluster it has.
    fake.run["spec"]["image"] = "registry.example/team/trainer:v2"
    fake.run["spec"]["workers"] = {**fake.run["spec"].get("workers", {}), "replicas": 3}
    fake.set_job("burst-a1", "RUNNING", "Running")
    reconcile(cluster, config, "ns", "burst")
    assert "delete burst-c1" not in fake.calls
    # The attempt ends (a worker reclaimed): the next runs on a new cluster of the new shape.
    worker = disrupted_pod("burst-c1-workers-x", "worker", "burst-c1", long_ago)
    record_cluster_pod_disrupted(cluster, worker, datetime.now(UTC))
    fake.set_job("burst-a1", "FAILED", "Failed", ended=long_ago)
    reconcile(cluster, config, "ns", "burst")
    reconcile(cluster, config, "ns", "burst")
    second = fake.run["status"]["attempts"][1]
    assert second["rayCluster"] == "burst-c2"
    MEMORY.events.drain()
    assert any("the run's spec now makes another" in message for message in events), events
    assert "burst-c1" not in fake.ray_clusters
    replaced = fake.ray_clusters["burst-c2"]
    assert replaced["spec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert "registry.example/team/trainer:v2" in json.dumps(replaced["spec"])
    assert (
        replaced["metadata"]["annotations"]["spotray.dev/shape"] != made["metadata"]["annotations"]["spotray.dev/shape"]
    )


def test_a_kept_cluster_made_before_clusters_carried_their_shape_is_kept() -> None:
    old = RayClusterView("burst-c1", owner_uid=UID)
    obs = replace(observation("burst-c1", old), ray_cluster_shapes={"spot": "0123456789abcdef"})
    assert next_ray_cluster(obs, "spot") == ("burst-c1", None)
    other = RayClusterView("burst-c1", owner_uid=UID, shape="fedcba9876543210")
    assert next_ray_cluster(replace(obs, ray_cluster=other), "spot") == ("burst-c2", "burst-c1")


def test_a_suspended_attempts_rayjob_on_a_kept_cluster_goes_after_the_grace_period_at_most(tmp_path: Path) -> None:
    fake, config = kept_run(tmp_path, worker_grace_seconds=30)
    cluster: Any = fake
    reconcile(cluster, config, "ns", "burst")
    fake.set_job("burst-a1", "RUNNING", "Running")
    fake.run["spec"]["suspend"] = True
    reconcile(cluster, config, "ns", "burst")
    assert set(fake.rayjobs) == {"burst-a1"}, "the driver still records the emergency checkpoint"
    # A driver that never ends (its submitter stuck): the RayJob goes once the grace period and margin passed.
    suspended = fake.run["status"]["attempts"][0]
    long_ago = datetime.now(UTC) - timedelta(seconds=30 + 61)
    suspended["endTime"] = long_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
    reconcile(cluster, config, "ns", "burst")
    assert fake.rayjobs == {}


def test_resuming_before_the_suspended_attempts_rayjob_went_deletes_it() -> None:
    run = parse_training_run(new_run(UID))
    status = {
        "phase": "Suspended",
        "attempts": [{"attempt": 1, "rayJob": "burst-a1", "outcome": "Suspended", "rayCluster": "burst-c1"}],
    }
    state = RunState.from_status(status, "burst")
    job = RayJobView("RUNNING", "Running", owner_uid=UID)
    plan = plan_of(Observation(run, state, job, run_uid=UID, ray_cluster_per_run=True), datetime.now(UTC))
    assert plan.create_attempt == 2
    assert plan.delete_rayjob == "burst-a1"


def test_a_namesakes_rayjob_is_never_deleted_as_a_leftover() -> None:
    run = parse_training_run(new_run(UID))
    status = {"phase": "Suspended", "attempts": [{"attempt": 1, "rayJob": "burst-a1", "outcome": "Suspended"}]}
    job = RayJobView("RUNNING", "Running", owner_uid="a-deleted-run-of-the-same-name")
    obs = Observation(run, RunState.from_status(status, "burst"), job, run_uid=UID)
    assert plan_of(obs, datetime.now(UTC)).delete_rayjob is None


def test_a_failed_attempts_rayjob_stays_for_its_logs_when_the_next_attempt_starts() -> None:
    """Only a suspended attempt's leftover RayJob goes with the next start: a failed one's driver logs are
    read from its RayJob until its TTL (`spotray logs`; tests/e2e/test_controller.py found this)."""
    run = parse_training_run(new_run(UID))
    status = {"phase": "Resuming", "attempts": [{"attempt": 1, "rayJob": "burst-a1", "outcome": "Failed"}]}
    job = RayJobView("FAILED", "Failed", owner_uid=UID)
    plan = plan_of(Observation(run, RunState.from_status(status, "burst"), job, run_uid=UID), datetime.now(UTC))
    assert plan.create_attempt == 2
    assert plan.delete_rayjob is None


def test_a_queued_run_gets_a_cluster_of_its_own_per_attempt_where_the_others_keep_theirs(tmp_path: Path) -> None:
    """Kueue admits a RayJob only with a cluster of its own, whose pods it counts: under a controller that
    keeps a cluster per run, a run that names a queue runs each attempt on its RayJob's own cluster
    (rather than being refused, which made the two settings exclude each other for a whole install)."""
    fake, config = kept_run(tmp_path, {"backoffSeconds": 0}, settle_seconds=0)
    fake.run["spec"]["queue"] = {"name": "team-a"}
    cluster: Any = fake
    reconcile(cluster, config, "ns", "burst")
    assert fake.calls[:1] == ["create burst-a1"], "no RayCluster of the run's"
    assert not fake.ray_clusters
    spec = fake.rayjobs["burst-a1"]["spec"]
    assert "clusterSelector" not in spec
    assert spec["rayClusterSpec"]
    assert spec["suspend"] is True, "made suspended for Kueue to admit"
    attempt = fake.run["status"]["attempts"][0]
    assert attempt.get("rayCluster") is None
    assert attempt["outcome"] == "Running", attempt


def test_the_controller_refuses_both_cluster_settings_naming_the_chart_values_that_exist() -> None:
    """Both settings at once are refused at start-up; the fix names the chart's own values (it named
    rayJob.clusterPerRun, which the chart does not have)."""
    env = {"SPOTRAY_RAY_CLUSTER_SELECTOR": '{"ray.io/cluster": "shared"}', "SPOTRAY_RAY_CLUSTER_PER_RUN": "true"}
    with pytest.raises(SpotrayError) as refused:
        ControllerConfig.from_env(env)
    assert "controller.rayClusterPerRun" in refused.value.fix
    assert "rayCluster.enabled" in refused.value.fix
