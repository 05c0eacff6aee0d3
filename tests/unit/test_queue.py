"""Kueue (issue 71): a TrainingRun with spec.queue.name becomes RayJobs that Kueue admits, made
suspended with the queue's label; the run says queued while it waits, spending nothing past its start
deadline, and an attempt Kueue evicts is a preemption whose next attempt queues again. The real Kueue
admits them on the test bed: tests/e2e/test_kueue.py (kwok) and test_real_pods.py (real pods)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob, keeps_ray_cluster, queue_refusal
from spotray.controller.reconcile import rayjob_view
from spotray.decisions.conditions import conditions
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.run_state import RunState
from tests.lifecycle_runs import NOW, planned, run

pytestmark = pytest.mark.unit

QUEUE = {"name": "team-a", "priorityClass": "research"}
QUEUED = RayJobView(job_status=None, deployment_status="Suspended", suspended=True)
ADMITTED = RayJobView(job_status=None, deployment_status="Initializing")
RUNNING = RayJobView(job_status="RUNNING", deployment_status="Running")
EVICTED = RayJobView(job_status=None, deployment_status="Suspending", suspended=True)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def observe(state: RunState, job: RayJobView | None, **spec: Any) -> Observation:
    retry = {"maxPreemptions": 5, "maxFailures": 0, "backoffSeconds": 0}
    return Observation(
        run(queue=QUEUE, retry=retry, **spec), state, job, AttemptRecords(), settle_seconds=5,
        start_deadline_seconds=60,
    )  # fmt: skip


def test_a_queued_runs_rayjob_carries_the_queue_and_is_made_suspended() -> None:
    queued = build_rayjob(run(queue=QUEUE), 1, "uid", ControllerConfig())
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"
    assert queued["spec"]["suspend"] is True
    plain = build_rayjob(run(), 1, "uid", ControllerConfig())
    assert "suspend" not in plain["spec"]
    assert not any(key.startswith("kueue.x-k8s.io/") for key in plain["metadata"]["labels"])


@pytest.mark.parametrize("spares", [0, 1])
def test_a_queued_rayjob_passes_what_kueues_rayjob_webhook_checks(spares: int) -> None:
    """The test bed registers no Kueue webhook (testbed/kueue.py), so the rules of its RayJob validation
    (pkg/controller/jobs/rayjob/rayjob_webhook.go, raycluster/common.go at v0.17.0) are held here: a
    cluster of the job's own, deleted when the job ends, no autoscaler, at most 7 worker groups, none
    named "head"."""
    spec = build_rayjob(run(queue=QUEUE, workers={"spareReplicas": spares}), 1, "uid", ControllerConfig())["spec"]
    assert "clusterSelector" not in spec
    assert spec["rayClusterSpec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert not cluster.get("enableInTreeAutoscaling")
    groups = [group["groupName"] for group in cluster["workerGroupSpecs"]]
    assert len(groups) <= 7, groups
    assert "head" not in groups, groups


def test_a_queue_on_the_charts_long_lived_ray_cluster_is_refused_as_bad_input() -> None:
    assert queue_refusal(run(queue=QUEUE), ControllerConfig()) is None
    refusal = queue_refusal(run(queue=QUEUE), ControllerConfig(ray_cluster_selector={"a": "b"}))
    assert refusal is not None
    assert refusal.content_is_cause, "the same spec would be refused again"
    assert "Kueue admits a RayJob only with a Ray cluster of its own" in refusal.message
    assert "rayCluster.enabled" in refusal.message
    # A cluster kept per run is not refused: a queued run's attempts get clusters of their own
    # (tests/unit/test_ray_cluster_per_run.py).
    assert queue_refusal(run(queue=QUEUE), ControllerConfig(ray_cluster_per_run=True)) is None
    assert keeps_ray_cluster(run(), ControllerConfig(ray_cluster_per_run=True))
    assert not keeps_ray_cluster(run(queue=QUEUE), ControllerConfig(ray_cluster_per_run=True))


def test_the_controller_reads_whether_a_rayjob_is_suspended() -> None:
    body = {"metadata": {}, "spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Suspended"}}
    view = rayjob_view(body)
    assert view is not None
    assert view.suspended
    assert view.queued


def test_a_run_waiting_for_its_queue_says_queued_and_spends_nothing_past_its_deadline() -> None:
    state = planned(observe(RunState(), None), at(0)).state
    first = planned(observe(state, QUEUED), at(5))
    later = planned(observe(first.state, QUEUED), at(3600))
    assert later.state.phase == "Pending"
    assert later.delete_rayjob is None
    assert later.state.failures == 0
    assert "queued: RayJob r-a1 waits for Kueue's LocalQueue team-a to admit it" in later.state.message
    assert [e.reason for e in first.events] == ["WaitingForCapacity"]
    shown = {c.type: c for c in conditions(later.state, [], 1, at(3600))}
    assert shown["WaitingForCapacity"].status == "True"
    # Admitted: it starts, and the wait is over.
    started = planned(observe(later.state, ADMITTED), at(3610)).state
    assert started.current is not None
    assert started.current.capacity_wait_since is None
    assert started.current.capacity_waited_seconds == 3605
    assert planned(observe(started, RUNNING), at(3650)).state.phase == "Running"


def test_a_queue_wait_never_moves_a_spot_then_on_demand_run() -> None:
    fallback = {"capacity": "spot-then-on-demand", "fallback": {"afterWaitSeconds": 60}}
    state = planned(observe(RunState(), None, workers=fallback), at(0)).state
    state = planned(observe(state, QUEUED, workers=fallback), at(5)).state
    still = planned(observe(state, QUEUED, workers=fallback), at(600))
    assert still.state.phase == "Pending"
    assert still.state.current is not None
    assert still.state.current.attempt == 1


def test_an_attempt_kueue_evicts_is_a_preemption_and_the_next_queues_again() -> None:
    state = planned(observe(RunState(), None), at(0)).state
    state = planned(observe(state, RUNNING), at(100)).state
    assert state.phase == "Running"
    evicted = planned(observe(state, EVICTED), at(200))
    ended = evicted.state.current
    assert ended is not None
    assert (ended.outcome, ended.reason) == ("Preempted", "QueueEvicted")
    assert evicted.state.preemptions == 1
    assert evicted.state.failures == 0
    assert evicted.delete_rayjob == "r-a1"
    following = planned(observe(evicted.state, None), at(201))
    assert following.create_attempt == 2
