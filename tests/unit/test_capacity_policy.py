"""spec.workers.capacity (issue 71): spot, on-demand, or spot-then-on-demand, which falls back to
on-demand nodes when spot workers wait too long or are reclaimed too often, and goes back to spot at
the next attempt; where each attempt ran is in its status entry, and status.cost prices each part."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.contract.spec import InvalidSpecError
from spotray.contract.status import Goodput
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob, ray_cluster_shape
from spotray.decisions.cost import Prices, run_cost
from spotray.decisions.observation import Observation, PodsWaiting, RayClusterView, RayJobView
from spotray.decisions.run_state import RunState
from tests.lifecycle_runs import NOW, planned, run

pytestmark = pytest.mark.unit

STARTING = RayJobView(job_status=None, deployment_status="Initializing")
RUNNING = RayJobView(job_status="RUNNING", deployment_status="Running")
NO_SPOT = PodsWaiting(capacity="pod r-a1-worker-x: 0/3 nodes are available: 3 node(s) had untolerated taint")
RETRY = {"maxPreemptions": 10, "maxFailures": 1, "backoffSeconds": 10}
FALLBACK = {"capacity": "spot-then-on-demand", "fallback": {"afterWaitSeconds": 300}}


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def observe(state: RunState, job: RayJobView | None, waiting: PodsWaiting | None = None, **workers: Any) -> Observation:
    return Observation(
        run(workers=workers, retry=RETRY), state, job, AttemptRecords(), settle_seconds=5, start_deadline_seconds=900,
        pods_waiting=waiting,
    )  # fmt: skip


def test_spot_workers_short_of_capacity_move_to_on_demand_nodes_at_once_spending_nothing() -> None:
    state = planned(observe(RunState(), None, **FALLBACK), at(0)).state
    assert state.current is not None
    assert state.current.capacity == "spot"
    state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(10)).state
    assert state.phase == "Pending", "waiting for spot capacity"
    moved = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(311))
    ended = moved.state.current
    assert ended is not None
    assert (ended.outcome, ended.reason) == ("Interrupted", "CapacityFallback")
    assert "afterWaitSeconds=300" in ended.message
    assert moved.delete_rayjob == "r-a1", "the spot pods give their place up"
    assert (moved.state.failures, moved.state.preemptions) == (0, 0)
    assert moved.requeue_after_s == 0.0
    assert [e.reason for e in moved.events] == ["CapacityFallback"]

    second = planned(observe(moved.state, None, **FALLBACK), at(311))
    assert second.create_attempt == 2
    assert second.state.current is not None
    assert second.state.current.capacity == "on-demand"
    assert "on on-demand nodes" in second.events[0].message


def test_an_on_demand_attempt_runs_its_workers_where_the_heads_go() -> None:
    config = ControllerConfig()
    spot_job = build_rayjob(run(workers=FALLBACK), 1, "uid", config, capacity="spot")
    demand_job = build_rayjob(run(workers=FALLBACK), 2, "uid", config, capacity="on-demand")
    spot_worker = spot_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    demand_worker = demand_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spot_worker["nodeSelector"] == config.spot_node_selector
    assert spot_worker["tolerations"] == config.spot_tolerations
    assert demand_worker["nodeSelector"] == config.head_node_selector
    assert "tolerations" not in demand_worker
    assert ray_cluster_shape(run(workers=FALLBACK), config, "spot") != ray_cluster_shape(
        run(workers=FALLBACK), config, "on-demand"
    ), "a kept cluster is made anew when its workers move"


def test_after_an_on_demand_attempt_ends_the_next_tries_spot_again() -> None:
    state = planned(observe(RunState(), None, **FALLBACK), at(0)).state
    state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(10)).state
    state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(400)).state  # falls back
    state = planned(observe(state, None, **FALLBACK), at(400)).state  # attempt 2, on-demand
    state = planned(observe(state, RUNNING, **FALLBACK), at(500)).state
    lost = RayJobView("FAILED", "Failed", "", end_time=at(590), disruption="pod r-a2-worker-x on node od-1: evicted")
    state = planned(observe(state, lost, **FALLBACK), at(600)).state
    assert state.current is not None
    assert state.current.outcome == "Preempted"
    third = planned(observe(state, None, **FALLBACK), at(620))  # after the 10 s backoff
    assert third.create_attempt == 3
    assert third.state.current is not None
    assert third.state.current.capacity == "spot"
    assert "back on spot nodes" in third.events[0].message


def test_a_notice_on_an_on_demand_attempt_is_named_an_eviction_not_a_spot_notice() -> None:
    """Issue #71: a drain of an on-demand node (maintenance, an upgrade) gives the pods the same SIGTERM a
    spot notice does, and the job saves and stops the same way; its reason says what it was."""

    def ended_on(capacity_left_by: float) -> Any:
        state = planned(observe(RunState(), None, **FALLBACK), at(0)).state
        if capacity_left_by:  # spot short: attempt 2 runs on on-demand nodes
            state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(10)).state
            state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(capacity_left_by)).state
            state = planned(observe(state, None, **FALLBACK), at(capacity_left_by)).state
        state = planned(observe(state, RUNNING, **FALLBACK), at(500)).state
        stopped = RayJobView("FAILED", "Failed", "", end_time=at(590))
        notice = replace(observe(state, stopped, **FALLBACK), records=AttemptRecords(preempted={"step": 40}))
        return planned(notice, at(600)).state

    on_demand = ended_on(capacity_left_by=400)
    assert on_demand.current.capacity == "on-demand"
    assert (on_demand.current.outcome, on_demand.current.reason) == ("Preempted", "EvictionNotice")
    assert "on-demand" in on_demand.current.message
    assert "emergency checkpoint at step 40" in on_demand.current.message
    assert on_demand.failures == 0
    spot = ended_on(capacity_left_by=0)
    assert spot.current.capacity == "spot"
    assert (spot.current.outcome, spot.current.reason) == ("Preempted", "SpotNotice")


def test_repeated_preemptions_move_the_run_to_on_demand_until_they_are_old() -> None:
    often = {"capacity": "spot-then-on-demand", "fallback": {"afterPreemptions": 2, "withinSeconds": 1800}}
    state = planned(observe(RunState(), None, **often), at(0)).state
    for attempt, second in ((1, 100), (2, 400)):
        state = planned(observe(state, RUNNING, **often), at(second - 50)).state
        lost = RayJobView("FAILED", "Failed", "", end_time=at(second), disruption=f"pod r-a{attempt}-w on node s: gone")
        state = planned(observe(state, lost, **often), at(second + 10)).state
        state = planned(observe(state, None, **often), at(second + 30)).state  # after the 10 s backoff
    assert state.current is not None
    assert state.current.attempt == 3
    assert state.current.capacity == "on-demand", "two preemptions within 1800 s"
    assert [a.capacity for a in state.attempts] == ["spot", "spot", "on-demand"]
    # Much later, that attempt is preempted too (a rare on-demand loss): the old ones have aged out.
    lost = RayJobView("FAILED", "Failed", "", end_time=at(5000), disruption="pod r-a3-w on node od: gone")
    state = planned(observe(state, RUNNING, **often), at(4000)).state
    state = planned(observe(state, lost, **often), at(5010)).state
    state = planned(observe(state, None, **often), at(5030)).state
    assert state.current is not None
    assert state.current.capacity == "spot"


def test_plain_spot_waits_and_never_falls_back() -> None:
    state = planned(observe(RunState(), None, capacity="spot"), at(0)).state
    for second in (10, 3600, 7200):
        state = planned(observe(state, STARTING, NO_SPOT, capacity="spot"), at(second)).state
        assert state.phase == "Pending"
        assert state.current is not None
        assert state.current.attempt == 1


@pytest.mark.parametrize(
    ("workers", "capacity"), [({"spot": False}, "on-demand"), ({}, "spot"), ({"capacity": "on-demand"}, "on-demand")]
)
def test_the_older_spot_field_still_says_where_workers_run(workers: dict[str, Any], capacity: str) -> None:
    state = planned(observe(RunState(), None, **workers), at(0)).state
    assert state.current is not None
    assert state.current.capacity == capacity


def test_capacity_and_an_older_spot_false_that_disagree_are_refused() -> None:
    with pytest.raises(InvalidSpecError, match=r"spec\.workers\.capacity: spot-then-on-demand with spot: false"):
        run(workers={"capacity": "spot-then-on-demand", "spot": False})


def test_a_kept_cluster_is_replaced_when_the_workers_move() -> None:
    config = ControllerConfig()
    spec = run(workers=FALLBACK)
    shapes = {c: ray_cluster_shape(spec, config, c) for c in ("spot", "on-demand")}
    state = planned(Observation(spec, RunState(), None, ray_cluster_per_run=True), at(0)).state
    state = planned(
        Observation(spec, state, STARTING, pods_waiting=NO_SPOT, ray_cluster_per_run=True,
                    ray_cluster=RayClusterView("r-c1", shape=shapes["spot"]), ray_cluster_shapes=shapes), at(10),
    ).state  # fmt: skip
    state = planned(
        Observation(spec, state, STARTING, pods_waiting=NO_SPOT, ray_cluster_per_run=True,
                    ray_cluster=RayClusterView("r-c1", shape=shapes["spot"]), ray_cluster_shapes=shapes), at(400),
    ).state  # fmt: skip
    moved = planned(
        Observation(spec, state, None, ray_cluster_per_run=True,
                    ray_cluster=RayClusterView("r-c1", shape=shapes["spot"]), ray_cluster_shapes=shapes), at(400),
    )  # fmt: skip
    assert moved.state.current is not None
    assert (moved.state.current.capacity, moved.state.current.ray_cluster) == ("on-demand", "r-c2")
    assert moved.delete_ray_cluster == "r-c1"


def test_the_cost_prices_on_demand_attempts_at_the_on_demand_price() -> None:
    prices = Prices(currency="USD", spot_per_hour=1.0, on_demand_per_hour=3.0)
    state = planned(observe(RunState(), None, **FALLBACK), at(0)).state
    state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(10)).state
    state = planned(observe(state, STARTING, NO_SPOT, **FALLBACK), at(400)).state
    state = planned(observe(state, None, **FALLBACK), at(400)).state  # attempt 2 on on-demand from 400 s
    ledger = Goodput(wall_seconds=2200, surviving_step_seconds=1500)
    cost = run_cost(ledger, run(workers=FALLBACK).spec.workers, prices, state.attempts, at(2200))
    assert cost.on_demand_seconds == 1800
    # 2 workers: 400 s on spot at 1.0 and 1800 s on on-demand at 3.0, per worker.
    assert cost.run == pytest.approx(round(2 * (400 * 1.0 + 1800 * 3.0) / 3600, 2))


def test_a_notice_to_the_ray_head_is_an_eviction_and_never_moves_the_workers_off_spot() -> None:
    """The Ray head runs on on-demand nodes: a notice that reached it (a drain of that pool for an
    upgrade) is no spot reclaim, however the workers ran. Seen on real pods (the head-to-head's head
    eviction was recorded SpotNotice), and counted by afterPreemptions, it moved spot workers to
    on-demand nodes for nothing."""
    often = {"capacity": "spot-then-on-demand", "fallback": {"afterPreemptions": 2, "withinSeconds": 1800}}
    head = "the Ray head's pod r-a{n}-head-x on node od: EvictionByEvictionAPI: Eviction API: evicting"
    state = planned(observe(RunState(), None, **often), at(0)).state
    for attempt, second in ((1, 100), (2, 400)):
        state = planned(observe(state, RUNNING, **often), at(second - 50)).state
        stopped = RayJobView("FAILED", "Failed", "", end_time=at(second), disruption=head.format(n=attempt))
        notice = replace(observe(state, stopped, **often), records=AttemptRecords(preempted={"step": 40 * attempt}))
        state = planned(notice, at(second + 10)).state
        ended = state.attempts[attempt - 1]
        assert (ended.outcome, ended.reason) == ("Preempted", "EvictionNotice")
        assert "Ray head" in ended.message
        state = planned(observe(state, None, **often), at(second + 30)).state
    assert state.current is not None
    assert state.current.attempt == 3
    assert state.current.capacity == "spot", "two evictions of the head are no spot pool reclaimed often"
    assert state.preemptions == 2, "a preemption all the same: no failure spent"
