"""Waiting for capacity never spends a budget (issue 71): an attempt whose pods the scheduler cannot
place waits, says for what and since when, and is bounded only by spec.retry.maxWaitSeconds; a pod
that cannot start wherever it goes (an image, a Secret) stays bad input at the start deadline."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.contract.spec import InvalidSpecError
from spotray.controller.config import ControllerConfig
from spotray.controller.pod_waits import pods_waiting
from spotray.controller.reconcile import MEMORY, reconcile
from spotray.decisions.conditions import conditions
from spotray.decisions.observation import Observation, PodsWaiting, RayJobView
from spotray.decisions.run_state import Plan, RunState
from tests.lifecycle_runs import NOW, planned, run
from tests.unit.test_controller_writes import FakeCluster, new_run

pytestmark = pytest.mark.unit

STARTING = RayJobView(job_status=None, deployment_status="Initializing")
RUNNING = RayJobView(job_status="RUNNING", deployment_status="Running")
SUCCEEDED = RayJobView("SUCCEEDED", "Complete", end_time=None)
NO_SPOT_NODE = (
    "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint {spotray.dev/spot: }. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)
UNSCHEDULABLE = PodsWaiting(capacity=f"pod r-a1-worker-x: {NO_SPOT_NODE}")
DEADLINE_S = 900


def observe(state: RunState, job: RayJobView | None, waiting: PodsWaiting | None, **spec: Any) -> Observation:
    return Observation(
        run(**spec), state, job, AttemptRecords(), settle_seconds=5, start_deadline_seconds=DEADLINE_S,
        pods_waiting=waiting,
    )  # fmt: skip


def started() -> RunState:
    return planned(Observation(run(), RunState(), None), NOW).state


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def test_pods_the_scheduler_cannot_place_wait_past_the_start_deadline_and_spend_nothing() -> None:
    waiting = planned(observe(started(), STARTING, UNSCHEDULABLE), at(60))
    later = planned(observe(waiting.state, STARTING, UNSCHEDULABLE), at(DEADLINE_S * 4))

    assert later.state.phase == "Pending"
    assert later.delete_rayjob is None
    assert later.create_attempt is None
    assert later.state.failures == 0
    assert later.state.preemptions == 0
    current = later.state.current
    assert current is not None
    assert current.outcome == "Running"
    assert current.capacity_wait_since == "2026-11-23T12:01:00Z", "since the wait was first seen"
    assert "waiting for capacity since 2026-11-23T12:01:00Z" in later.state.message
    assert NO_SPOT_NODE in later.state.message, "for what: the scheduler's own words"
    assert "no budget is spent" in later.state.message
    assert [e.reason for e in waiting.events] == ["WaitingForCapacity"], "one Event when the wait begins"
    assert later.events == ()
    assert later.requeue_after_s is not None
    assert later.requeue_after_s <= 30
    shown = {c.type: c for c in conditions(later.state, [], 1, at(DEADLINE_S * 4))}
    assert shown["WaitingForCapacity"].status == "True"
    assert NO_SPOT_NODE in (shown["WaitingForCapacity"].message or "")


def test_a_spot_shortage_of_one_hour_ends_succeeded_with_no_failure_spent() -> None:
    """The issue's done-when: the chart's defaults (a 900 s start deadline, maxFailures 1 here)."""
    state = started()
    for minute in range(61):  # a reconcile a minute: an hour with no spot node
        state = planned(observe(state, STARTING, UNSCHEDULABLE), at(60 * minute)).state
        assert state.phase == "Pending", f"minute {minute}: {state.message}"
    # The spot pool scales up: the pods are placed, pull their image and start.
    placed = PodsWaiting()
    state = planned(observe(state, STARTING, placed), at(3660)).state
    assert state.current is not None
    assert state.current.capacity_wait_since is None
    assert state.current.capacity_waited_seconds == 3660
    state = planned(observe(state, STARTING, placed), at(3660 + DEADLINE_S - 60)).state
    assert state.phase == "Pending", "the start deadline counts from the end of the wait"
    state = planned(observe(state, RUNNING, None), at(3660 + DEADLINE_S)).state
    assert state.phase == "Running"
    done = planned(observe(state, replace(SUCCEEDED, end_time=at(9000)), None), at(9000))
    assert done.state.phase == "Succeeded"
    assert (done.state.failures, done.state.preemptions) == (0, 0)
    assert len(done.state.attempts) == 1


def test_after_the_wait_the_start_deadline_still_ends_an_attempt_that_cannot_start() -> None:
    state = planned(observe(started(), STARTING, UNSCHEDULABLE), at(0)).state
    state = planned(observe(state, STARTING, PodsWaiting()), at(3000)).state
    ended = planned(observe(state, STARTING, PodsWaiting()), at(3000 + DEADLINE_S + 1))
    assert ended.state.current is not None
    assert (ended.state.current.outcome, ended.state.current.reason) == ("Failed", "StartDeadlineExceeded")
    assert "waited 3000 s for capacity" in ended.state.current.message


def test_a_pod_that_cannot_pull_its_image_stays_bad_input_with_its_own_words() -> None:
    stuck = PodsWaiting(
        capacity=f"pod r-a1-worker-x: {NO_SPOT_NODE}",
        stuck='pod r-a1-head-y: container ray-head: ImagePullBackOff: Back-off pulling image "typo:1"',
    )
    waiting = planned(observe(started(), STARTING, stuck), at(DEADLINE_S - 1))
    assert "waiting for capacity" not in waiting.state.message, "a pod that cannot start is no capacity wait"
    ended = planned(observe(waiting.state, STARTING, stuck), at(DEADLINE_S + 1))
    assert ended.state.current is not None
    assert ended.state.current.reason == "StartDeadlineExceeded"
    assert 'ImagePullBackOff: Back-off pulling image "typo:1"' in ended.state.current.message
    assert ended.state.failures == 1


def test_pods_that_cannot_be_read_never_end_an_attempt_at_the_deadline() -> None:
    unknown = PodsWaiting(unreadable="(403) Forbidden: pods is forbidden")
    held = planned(observe(started(), STARTING, unknown), at(DEADLINE_S * 2))
    assert held.state.phase == "Pending"
    assert held.state.failures == 0
    assert held.delete_rayjob is None
    assert "pods is forbidden" in held.state.message


def test_max_wait_seconds_bounds_the_wait_and_fails_the_run_without_spending_a_failure() -> None:
    bounded = {"retry": {"maxPreemptions": 2, "maxFailures": 1, "backoffSeconds": 10, "maxWaitSeconds": 1800}}
    state = planned(observe(started(), STARTING, UNSCHEDULABLE, **bounded), at(0)).state
    assert "spec.retry.maxWaitSeconds=1800" in state.message
    state = planned(observe(state, STARTING, UNSCHEDULABLE, **bounded), at(1799)).state
    assert state.phase == "Pending"
    ended = planned(observe(state, STARTING, UNSCHEDULABLE, **bounded), at(1801))
    assert ended.state.phase == "Failed"
    assert ended.state.failure_reason == "CapacityWaitExceeded"
    assert ended.state.failures == 0, "a capacity wait is no failure of the job"
    assert ended.delete_rayjob == "r-a1", "its pending pods give their place in the queue back"
    assert "spec.retry.maxWaitSeconds" in ended.state.message
    assert "resumes" in ended.state.message


def test_max_wait_seconds_is_declared_and_checked() -> None:
    assert run().spec.retry.max_wait_seconds is None
    with pytest.raises(InvalidSpecError, match=r"spec.retry.maxWaitSeconds: must be >= 1"):
        run(retry={"maxWaitSeconds": 0})


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Pending", **status}}


UNSCHEDULABLE_CONDITION = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": NO_SPOT_NODE,
    "lastTransitionTime": "2026-11-23T12:00:00Z",
}


def test_the_pods_say_what_they_wait_for() -> None:
    placed = pod("r-a1-head-a", conditions=[{"type": "PodScheduled", "status": "True"}])
    unplaced = pod("r-a1-worker-b", conditions=[UNSCHEDULABLE_CONDITION])
    assert pods_waiting([placed, unplaced]) == PodsWaiting(capacity=f"pod r-a1-worker-b: {NO_SPOT_NODE}")
    assert pods_waiting([placed]) == PodsWaiting()
    assert pods_waiting([]) == PodsWaiting()
    two = pods_waiting([unplaced, pod("r-a1-worker-c", conditions=[UNSCHEDULABLE_CONDITION])])
    assert two.capacity.startswith("pod r-a1-worker-b: ")
    assert two.capacity.endswith("(and 1 more pod)")


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ImagePullBackOff", 'Back-off pulling image "ghcr.io/me/typo:1"'),
        ("ErrImagePull", "failed to pull and unpack image"),
        ("InvalidImageName", "couldn't parse image name"),
        ("CreateContainerConfigError", 'secret "hf-token" not found'),
    ],
)
def test_a_pod_that_cannot_start_wherever_it_goes_is_stuck(reason: str, message: str) -> None:
    stuck = pod(
        "r-a1-head-a",
        conditions=[{"type": "PodScheduled", "status": "True"}],
        containerStatuses=[{"name": "ray-head", "state": {"waiting": {"reason": reason, "message": message}}}],
    )
    assert pods_waiting([stuck]) == PodsWaiting(stuck=f"pod r-a1-head-a: container ray-head: {reason}: {message}")


@pytest.mark.parametrize(
    "missing",
    [
        'persistentvolumeclaim "spotray-shared" not found',
        'persistentvolumeclaim "spotray-shared" is being deleted',
    ],
)
def test_a_pod_whose_volume_claim_is_missing_is_stuck_not_waiting_for_capacity(missing: str) -> None:
    # The scheduler says Unschedulable, but no node will ever come for it: the shared volume's claim
    # is not in the run's namespace (the chart makes it in the release namespace). Waiting for capacity
    # would wait forever, spending nothing and saying nothing true (kube-scheduler's volumebinding plugin).
    said = f"0/3 nodes are available: {missing}. preemption: 0/3 nodes are available: 3 Preemption is not helpful."
    unplaced = pod("r-a1-head-a", conditions=[{**UNSCHEDULABLE_CONDITION, "message": said}])
    assert pods_waiting([unplaced]) == PodsWaiting(stuck=f"pod r-a1-head-a: {said}")


def test_a_running_or_slow_pod_waits_for_nothing() -> None:
    pulling = pod("p", containerStatuses=[{"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}])
    running = {"metadata": {"name": "q"}, "status": {"phase": "Running", "conditions": [UNSCHEDULABLE_CONDITION]}}
    assert pods_waiting([pulling, running]) == PodsWaiting()


def test_a_plan_while_waiting_keeps_the_state_the_next_reconcile_reads() -> None:
    first: Plan = planned(observe(started(), STARTING, UNSCHEDULABLE), at(10))
    assert RunState.from_status(first.state.to_status(), "r") == first.state


def test_the_controller_reads_the_pods_of_a_starting_attempt_and_lets_it_wait() -> None:
    """Through controller/reconcile.py: the same RayJob past its start deadline ends without pods that
    wait for capacity, and waits with them."""
    config = ControllerConfig(start_deadline_seconds=60)
    for pods, ends in (((), True), ((pod("burst-a1-worker-b", conditions=[UNSCHEDULABLE_CONDITION]),), False)):
        fake = FakeCluster(new_run("uid-capacity"))
        reconcile(fake, config, "ns", "burst")  # type: ignore[arg-type] # the calls reconcile makes
        fake.rayjobs["burst-a1"]["status"] = {"jobDeploymentStatus": "Initializing"}
        fake.run["status"]["attempts"][0]["startTime"] = "2026-01-01T00:00:00Z"  # long past the deadline
        fake.pods = pods
        reconcile(fake, config, "ns", "burst")  # type: ignore[arg-type]
        MEMORY.events.drain()
        assert ("delete burst-a1" in fake.calls) == ends, fake.calls
        status = fake.run["status"]
        if not ends:
            assert status["phase"] == "Pending"
            assert status["failures"] == 0
            assert status["attempts"][0]["capacityWaitSince"]
            assert NO_SPOT_NODE in status["message"]
