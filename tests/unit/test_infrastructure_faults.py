"""Infrastructure faults end an attempt without spending a budget, and never end the run by themselves.

The issue's two cases: a driver whose store did not answer at start exited 2 (bad input), and the
controller failed the run at once; Ray's "Job supervisor actor could not be scheduled" (a fault of
Ray's cluster, before the entrypoint ran) was counted as TrainingFailed and spent maxFailures.
The driver now exits 75 (EX_TEMPFAIL) for an infrastructure fault; the controller's one decision
(spotray/decisions/attempt_end.py ``classify_end``/``end_attempt``, which local mode calls too) ends such an
attempt as Interrupted (reason InfrastructureFault), spends nothing and starts the next attempt
after a backoff that doubles with each interruption in a row, at most 10 minutes. The literals
(75, "Interrupted", "InfrastructureFault") are the contract a user reads in status.
"""

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.decisions.attempt_end import AttemptEnd, classify_end, end_attempt
from spotray.decisions.observation import RayJobView
from spotray.decisions.run_state import RunState
from tests.lifecycle_runs import NOW, run, step

pytestmark = pytest.mark.unit

UNREACHABLE = (
    "error: could not reach http://minio.spotray:9000 to check bucket s3://runs: Could not connect to the endpoint "
    "URL\n  fix: check that the S3 server is running"
)
RAY_EXIT_75 = (
    "Job entrypoint command failed with exit code 75, last available logs (truncated to 20,000 chars):\n"
    "loading the TrainingRun spec\n" + UNREACHABLE + "\n"
)
# What Ray's job manager writes, and KubeRay copies into the RayJob's status.message, when the Ray
# job fails before its entrypoint runs (ray/dashboard/modules/job/job_manager.py).
RAY_SUPERVISOR_FAULTS = [
    "Job supervisor actor could not be scheduled: The actor is not schedulable: The node specified via "
    "NodeAffinitySchedulingStrategy doesn't exist any more or is infeasible, and soft=False was specified.",
    "Job supervisor actor died: The actor died unexpectedly before finishing this task.",
    "Job supervisor actor failed to start within 900.0 seconds. This timeout can be configured by setting the "
    "environment variable RAY_JOB_START_TIMEOUT_SECONDS.",
    "Unexpected error occurred: failed to get job supervisor.",
]


def started(now: datetime = NOW) -> RunState:
    return step(RunState(), None, now=now).state


def failed_job(message: str, now: datetime = NOW) -> RayJobView:
    return RayJobView("FAILED", "Failed", message, end_time=now - timedelta(seconds=30))


def assert_interrupted_for_nothing(result, *, why: str) -> None:
    state = result.state
    assert (state.current.outcome, state.current.reason) == ("Interrupted", "InfrastructureFault")
    assert (state.preemptions, state.failures) == (0, 0), "an infrastructure fault spends no budget"
    assert state.phase == "Resuming"
    assert state.failure_reason == ""
    assert why in state.current.message
    assert why in state.message
    assert "no budget" in state.message
    assert result.create_attempt is None  # after the backoff
    assert result.requeue_after_s == 15  # max(backoffSeconds, 15 s) for the first one
    assert state.next_attempt_time == "2026-11-23T12:00:15Z"
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InfrastructureFault")]


def test_a_driver_that_recorded_exit_75_is_interrupted_and_spends_no_budget() -> None:
    records = AttemptRecords(outcome={"exit_code": 75, "step": None, "detail": UNREACHABLE})
    result = step(started(), failed_job("job exited 75"), records)
    assert_interrupted_for_nothing(result, why="could not reach http://minio.spotray:9000")


def test_exit_75_the_driver_could_not_record_is_read_from_rays_message() -> None:
    """Its store did not answer, so the driver could not write its record: Ray's message has its code."""
    result = step(started(), failed_job(RAY_EXIT_75))
    assert_interrupted_for_nothing(result, why="could not reach http://minio.spotray:9000")


@pytest.mark.parametrize("message", RAY_SUPERVISOR_FAULTS, ids=["unschedulable", "died", "start-timeout", "lost"])
def test_rays_job_supervisor_failing_before_the_entrypoint_is_an_infrastructure_fault(message: str) -> None:
    result = step(started(), failed_job(message))
    assert_interrupted_for_nothing(result, why=message[:40])


def test_the_jobs_own_record_wins_over_rays_message() -> None:
    """The driver ran and recorded a failure of the training code: that is what ended the attempt."""
    records = AttemptRecords(outcome={"exit_code": 1, "step": 20, "detail": "training failed: ValueError: bug"})
    result = step(started(), failed_job(RAY_SUPERVISOR_FAULTS[1]), records)
    assert (result.state.current.outcome, result.state.current.reason) == ("Failed", "TrainingFailed")
    assert result.state.failures == 1


def test_a_lost_node_is_still_a_preemption() -> None:
    lost = replace(failed_job(RAY_SUPERVISOR_FAULTS[1]), disruption="pod h on node n1: DeletionByPodGC")
    assert (classify_end(lost, AttemptRecords()).outcome, step(started(), lost).state.preemptions) == ("Preempted", 1)


def test_a_run_that_keeps_hitting_infrastructure_faults_is_never_failed_by_them() -> None:
    """30 attempts in a row end on an unreachable store (maxFailures is 1): the run waits, with a
    backoff that doubles up to 10 minutes, and says what it waits for and since when."""
    state, now = started(), NOW
    delays = []
    for _ in range(30):
        ended = step(state, failed_job(RAY_EXIT_75, now), now=now)
        assert ended.state.phase == "Resuming", ended.state.message
        assert (ended.state.preemptions, ended.state.failures) == (0, 0)
        assert "could not reach http://minio.spotray:9000" in ended.state.message
        delays.append(ended.requeue_after_s)
        now += timedelta(seconds=ended.requeue_after_s)
        state = step(ended.state, None, now=now).state  # the next attempt starts after the backoff
        assert state.current.outcome == "Running"
    assert delays[:8] == [15, 30, 60, 120, 240, 480, 600, 600]
    assert set(delays[6:]) == {600}, "the wait is bounded: at most 10 minutes between attempts"
    assert state.current.attempt == 31
    last = ended.state.message
    # Status keeps the last 20 attempts: the streak is older than the oldest of them, and says so.
    oldest_kept = ended.state.attempts[0]
    assert (oldest_kept.attempt, oldest_kept.outcome) == (11, "Interrupted")
    assert f"infrastructure faults since before {oldest_kept.start_time} (the last 20 attempts)" in last, last
    assert "no budget" in last
    # The infrastructure is back and the training code fails: that spends the failure budget as always.
    failed = step(state, failed_job("Job entrypoint command failed with exit code 1. No logs available.", now), now=now)
    assert (failed.state.current.reason, failed.state.failures) == ("TrainingFailed", 1)
    assert failed.requeue_after_s == 10  # the failure backoff, not the infrastructure one


def test_the_streak_says_since_when() -> None:
    first = step(started(), failed_job(RAY_EXIT_75))
    later = NOW + timedelta(seconds=15)
    second_start = step(first.state, None, now=later).state
    second = step(
        second_start, failed_job(RAY_EXIT_75, later + timedelta(seconds=60)), now=later + timedelta(seconds=60)
    )
    assert "infrastructure faults since 2026-11-23T12:00:00Z (2 attempts in a row" in second.state.message
    assert second.requeue_after_s == 30


def test_end_attempt_is_the_one_decision_for_an_interruption() -> None:
    end = AttemptEnd("Interrupted", "InfrastructureFault", "Job supervisor actor could not be scheduled: x")
    decided = end_attempt(started(), run(), end, NOW)
    assert (decided.state.phase, decided.state.failures, decided.requeue_after_s) == ("Resuming", 0, 15)
