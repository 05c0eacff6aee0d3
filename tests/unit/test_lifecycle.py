"""Every transition of spotray/decisions/run_plan.py ``plan``, without a cluster (``now`` is an argument)."""

from dataclasses import replace
from datetime import timedelta

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.contract.names import DISRUPTED_AT_ANNOTATION, DISRUPTION_ANNOTATION, MAX_RESERVED_ATTEMPT, rayjob_name
from spotray.contract.spec import MAX_NAME_LENGTH, parse_training_run
from spotray.contract.status import AttemptStatus
from spotray.controller.config import STORAGE_PATIENCE_SECONDS
from spotray.controller.disruptions import disruption_note, disruption_time
from spotray.controller.reconcile import rayjob_view
from spotray.decisions.conditions import conditions
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.run_state import MAX_ATTEMPTS_KEPT, Plan, RunState
from spotray.decisions.vocabulary import MAX_MESSAGE_CHARS
from tests.lifecycle_runs import NOW, run, step
from tests.lifecycle_runs import planned as plan

pytestmark = pytest.mark.unit


RUNNING_JOB = RayJobView(job_status="RUNNING", deployment_status="Running")
FAILED_JOB = RayJobView("FAILED", "Failed", "job exited 1", end_time=NOW - timedelta(seconds=30))


def started() -> RunState:
    return step(RunState(), None).state


def test_a_new_run_starts_attempt_one() -> None:
    result = step(RunState(), None)
    assert result.create_attempt == 1
    assert result.state.current.ray_job == "r-a1"
    assert result.state.phase == "Pending"
    assert [e.reason for e in result.events] == ["AttemptStarted"]


def test_a_running_job_makes_the_run_running_and_creates_nothing() -> None:
    result = step(started(), RUNNING_JOB)
    assert result.state.phase == "Running"
    assert result.create_attempt is None


def test_a_rayjob_that_vanished_is_judged_from_its_records_and_its_number_is_never_used_again() -> None:
    running = step(started(), RUNNING_JOB).state
    # No record: nothing known of its end, nothing spent; the next attempt is 2, never 1 again.
    unknown = step(running, None)
    assert unknown.create_attempt is None
    ended = unknown.state.current
    assert (ended.attempt, ended.outcome, ended.reason) == (1, "Interrupted", "RayJobGone")
    assert "r-a1 is gone" in ended.message
    assert (unknown.state.preemptions, unknown.state.failures) == (0, 0)
    later = step(unknown.state, None, now=NOW + timedelta(seconds=60))
    assert later.create_attempt == 2
    # Its records say: a spot notice, a success, a failure of the training code.
    assert step(running, None, AttemptRecords(preempted={"step": 3})).state.current.reason == "SpotNotice"
    finished = step(running, None, AttemptRecords(outcome={"exit_code": 0, "detail": "training finished"}))
    assert finished.state.phase == "Succeeded"
    failed = step(running, None, AttemptRecords(outcome={"exit_code": 1, "detail": "boom"}))
    assert (failed.state.current.reason, failed.state.failures) == ("TrainingFailed", 1)


def test_a_rayjob_still_running_long_after_its_job_recorded_its_end_is_judged_from_the_records() -> None:
    """Every wait has a bound: a job that recorded its end (its preemption once the emergency checkpoint
    was safe, or its outcome) and whose RayJob never finished (nemesis trial 39: a driver that never
    exited) ends from its records, and its RayJob is deleted."""
    running = step(started(), RUNNING_JOB).state
    recorded = (NOW - timedelta(seconds=30)).timestamp()
    preempted = AttemptRecords(preempted={"step": 37, "time": recorded})
    waiting = step(running, RUNNING_JOB, preempted)
    assert waiting.state.current.outcome == "Running"
    assert waiting.delete_rayjob is None
    assert waiting.requeue_after_s == pytest.approx(90)
    assert "recorded its preemption at step 37 30 s ago" in waiting.state.message

    overdue = step(running, RUNNING_JOB, preempted, now=NOW + timedelta(seconds=95))
    ended = overdue.state.current
    assert (ended.outcome, ended.reason) == ("Preempted", "SpotNotice")
    assert "at step 37" in ended.message
    assert "RayJob r-a1 was still unfinished 125 s after" in ended.message
    assert overdue.delete_rayjob == "r-a1"
    assert overdue.state.preemptions == 1

    finished = AttemptRecords(outcome={"exit_code": 0, "detail": "training finished", "time": recorded})
    done = step(running, RUNNING_JOB, finished, now=NOW + timedelta(seconds=95))
    assert (done.state.phase, done.delete_rayjob) == ("Succeeded", "r-a1")
    # A record without a readable time, or none at all: the RayJob alone decides, as before.
    assert step(running, RUNNING_JOB, AttemptRecords(preempted={"step": 37})).state.current.outcome == "Running"
    hostile = AttemptRecords(preempted={"step": 37, "time": 1e300})  # the run's owner writes the records
    assert step(running, RUNNING_JOB, hostile).state.current.outcome == "Running"
    assert step(running, RUNNING_JOB, None).state.current.outcome == "Running"


def test_an_unreadable_store_when_a_rayjob_vanished_decides_nothing() -> None:
    running = step(started(), RUNNING_JOB).state
    obs = Observation(run(), running, None, None, storage_error="connect timeout", settle_seconds=5)
    waiting = plan(obs, NOW)
    assert waiting.state.current.outcome == "Running"
    assert [e.reason for e in waiting.events] == ["WaitingForStorage"]


def test_success_ends_the_run() -> None:
    result = step(started(), RayJobView("SUCCEEDED", "Complete"))
    assert result.state.phase == "Succeeded"
    assert result.state.current.outcome == "Succeeded"
    assert step(result.state, None).create_attempt is None  # terminal


@pytest.mark.parametrize(
    ("job", "markers", "reason"),
    [
        (FAILED_JOB, AttemptRecords(preempted={"step": 40}), "SpotNotice"),
        (FAILED_JOB, AttemptRecords(outcome={"exit_code": 143, "step": 40}), "SpotNotice"),
        (replace(FAILED_JOB, disruption="pod w on node spot-1: DeletionByPodGC"), AttemptRecords(), "NodeLost"),
    ],
)
def test_preemption_facts_count_as_preemptions_not_failures(job, markers, reason) -> None:
    result = step(started(), job, markers)
    assert result.state.current.outcome == "Preempted"
    assert result.state.current.reason == reason
    assert (result.state.preemptions, result.state.failures) == (1, 0)
    assert result.state.phase == "Resuming"
    assert result.state.next_attempt_time == "2026-11-23T12:00:10Z"  # backoffSeconds


def test_a_preempted_or_interrupted_attempts_rayjob_is_deleted_once_judged_a_failed_ones_kept() -> None:
    """KubeRay keeps a finished RayJob's cluster for its TTL and replaces the pods a lost node took:
    they would hold the capacity the next attempt waits for. A failed attempt's stays, for its logs."""
    preempted = step(started(), FAILED_JOB, AttemptRecords(preempted={"step": 40}))
    assert (preempted.state.current.outcome, preempted.delete_rayjob) == ("Preempted", "r-a1")
    interrupted = step(started(), FAILED_JOB, AttemptRecords(outcome={"exit_code": 75, "detail": "store down"}))
    assert (interrupted.state.current.outcome, interrupted.delete_rayjob) == ("Interrupted", "r-a1")
    failed = step(started(), FAILED_JOB)
    assert (failed.state.current.outcome, failed.delete_rayjob) == ("Failed", None)
    # The run's last attempt keeps its cluster for the TTL: the run is over, nothing waits for capacity.
    spent = step(started(), FAILED_JOB, AttemptRecords(preempted={"step": 40}), retry={"maxPreemptions": 0})
    assert (spent.state.phase, spent.delete_rayjob) == ("Failed", None)


def test_a_node_lost_long_before_a_failure_is_not_its_cause() -> None:
    """An elastic run loses a node and goes on; an hour later it fails on a bug: a failure, not a preemption."""
    long_ago = replace(
        FAILED_JOB, disruption="pod w on node spot-1: DeletionByPodGC", disrupted_at=NOW - timedelta(hours=1)
    )
    result = step(started(), long_ago)
    assert (result.state.current.outcome, result.state.current.reason) == ("Failed", "TrainingFailed")
    assert (result.state.preemptions, result.state.failures) == (0, 1)
    just_before = replace(long_ago, disrupted_at=FAILED_JOB.end_time - timedelta(seconds=20))
    assert step(started(), just_before).state.current.reason == "NodeLost"
    after_the_end = replace(long_ago, disrupted_at=FAILED_JOB.end_time + timedelta(seconds=2))
    assert step(started(), after_the_end).state.current.reason == "NodeLost", "the node's loss is reported late"


def test_a_failure_without_facts_of_preemption_counts_against_the_failure_budget() -> None:
    result = step(started(), FAILED_JOB)
    assert result.state.current.outcome == "Failed"
    assert result.state.current.reason == "TrainingFailed"
    assert result.state.current.message == "job exited 1"
    assert (result.state.preemptions, result.state.failures) == (0, 1)


def test_bad_input_fails_the_run_at_once_naming_the_fix() -> None:
    result = step(started(), FAILED_JOB, AttemptRecords(outcome={"exit_code": 2, "detail": "bucket x missing"}))
    assert (result.state.current.reason, result.state.current.message) == ("BadInput", "bucket x missing")
    assert result.state.phase == "Failed"
    assert result.state.failure_reason == "BadInput"
    assert "bucket x missing" in result.state.message


# What Ray's job supervisor writes (and KubeRay copies into status.message) when the entrypoint fails.
RAY_BAD_INPUT_MESSAGE = (
    "Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n"
    + "loading the TrainingRun spec\n" * 300
    + "error: no S3 credentials were found for s3://runs/x\n  fix: create the Secret and name it (exit code 2)\n"
)


def test_bad_input_the_job_could_not_record_is_read_from_the_ray_job_and_fails_the_run_at_once() -> None:
    """The job could not write its record (no credentials to write it with): its exit code is in Ray's message."""
    job = RayJobView("FAILED", "Failed", RAY_BAD_INPUT_MESSAGE, end_time=NOW - timedelta(seconds=30))
    result = step(started(), job, AttemptRecords())
    assert result.state.current.reason == "BadInput"
    assert result.state.phase == "Failed"
    assert result.state.failure_reason == "BadInput"
    assert "error: no S3 credentials were found" in result.state.message, "the job's own words, from the log's end"
    assert (result.state.preemptions, result.state.failures) == (0, 1)


def test_a_driver_that_died_of_sigterm_without_the_jobs_record_is_no_preemption() -> None:
    """143 is the job's code for "stopped after an emergency checkpoint" only with its record to prove it."""
    message = "Job entrypoint command failed with exit code 143, last available logs (truncated to 20,000 chars):\nx"
    result = step(
        started(), RayJobView("FAILED", "Failed", message, end_time=NOW - timedelta(seconds=30)), AttemptRecords()
    )
    assert (result.state.current.outcome, result.state.current.reason) == ("Failed", "TrainingFailed")


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (RAY_BAD_INPUT_MESSAGE, 2),
        ("Job entrypoint command failed with exit code 1. No logs available.", 1),
        ("Job entrypoint command failed with exit code -9, last available logs (truncated to 20,000 chars):\nx", -9),
        ("the driver exited", None),
        ("", None),
    ],
)
def test_the_drivers_exit_code_is_read_from_rays_message(message: str, code: int | None) -> None:
    assert RayJobView("FAILED", "Failed", message).driver_exit_code == code


def test_the_storage_patience_is_the_operators_setting() -> None:
    unknown = Observation(run(), started(), FAILED_JOB, None, storage_error="403", storage_patience_seconds=30)
    waiting = plan(unknown, NOW)
    assert [e.reason for e in waiting.events] == ["WaitingForStorage"]
    later = NOW + timedelta(seconds=31)
    still = plan(replace(unknown, state=waiting.state), later)
    assert [e.reason for e in still.events] == ["StorageUnreachable"]
    assert (still.state.preemptions, still.state.failures) == (0, 0)
    shown = {c.type: c.status for c in conditions(still.state, [], 1, later, storage_patience_s=30)}
    assert shown["StorageUnreachable"] == "True"
    default = {c.type: c.status for c in conditions(still.state, [], 1, later)}
    assert default["StorageUnreachable"] == "False"  # 31 s is within the default patience


def test_an_unreadable_store_at_the_end_of_an_attempt_decides_nothing_and_spends_nothing() -> None:
    before = started()
    unknown = Observation(run(), before, FAILED_JOB, None, storage_error="connect timeout", settle_seconds=5)
    waiting = plan(unknown, NOW)
    assert waiting.state.current.outcome == "Running"  # no outcome recorded
    assert (waiting.state.preemptions, waiting.state.failures) == (0, 0)
    assert waiting.create_attempt is None
    assert waiting.requeue_after_s is not None
    assert "connect timeout" in waiting.state.message
    assert [e.reason for e in waiting.events] == ["WaitingForStorage"]
    later = NOW + timedelta(seconds=STORAGE_PATIENCE_SECONDS + 1)
    still = plan(replace(unknown, state=waiting.state), later)
    assert (still.state.preemptions, still.state.failures) == (0, 0)
    assert [e.reason for e in still.events] == ["StorageUnreachable"]
    shown = {c.type: c for c in conditions(still.state, [], 1, later)}
    assert shown["StorageUnreachable"].status == "True"
    # Readable again: decided from the records as usual, and the condition clears.
    readable = plan(replace(unknown, state=still.state, records=AttemptRecords(preempted={"step": 3})), later)
    assert readable.state.current.reason == "SpotNotice"
    assert readable.state.storage_unreachable_since is None


def test_a_rayjob_owned_by_another_run_is_never_adopted() -> None:
    old_success = RayJobView("SUCCEEDED", "Complete", owner_uid="uid-of-the-deleted-run")
    obs = Observation(run(), started(), old_success, run_uid="uid-of-this-run", settle_seconds=5)
    result = plan(obs, NOW)
    assert result.state.phase == "Pending"  # not Succeeded
    assert result.state.current.outcome == "Running"
    assert "belongs to another TrainingRun" in result.state.message
    assert result.requeue_after_s == 5.0
    ours = plan(replace(obs, job=replace(old_success, owner_uid="uid-of-this-run")), NOW)
    assert ours.state.phase == "Succeeded"


def test_a_40_kb_detail_is_cut_everywhere_the_status_shows_it() -> None:
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "RuntimeError: boom"
    result = step(started(), FAILED_JOB, AttemptRecords(outcome={"exit_code": 1, "detail": trace}))
    status = result.state.to_status()
    assert len(status["message"]) <= MAX_MESSAGE_CHARS
    assert "more characters cut" in status["message"]
    assert len(status["attempts"][-1]["message"]) <= MAX_MESSAGE_CHARS
    assert all(len(c.message or "") <= MAX_MESSAGE_CHARS for c in conditions(result.state, [], 1, NOW))
    assert all(len(e.message) <= MAX_MESSAGE_CHARS for e in result.events)


def test_attempts_keep_the_last_n_and_the_budgets_count_them_all() -> None:
    budget = {"maxPreemptions": 100, "maxFailures": 0, "backoffSeconds": 1}
    state = started()
    for n in range(MAX_ATTEMPTS_KEPT + 10):
        state = step(state, FAILED_JOB, AttemptRecords(preempted={"step": n}), retry=budget).state
        state = step(state, None, now=NOW + timedelta(seconds=5), retry=budget).state
        state = RunState.from_status(state.to_status())  # through the API server's shape, every time
    assert len(state.to_status()["attempts"]) == MAX_ATTEMPTS_KEPT
    assert state.preemptions == MAX_ATTEMPTS_KEPT + 10
    assert state.current.attempt == MAX_ATTEMPTS_KEPT + 11


def test_a_fresh_failure_waits_for_disruption_reports_to_settle() -> None:
    just_failed = replace(FAILED_JOB, end_time=NOW - timedelta(seconds=1))
    result = step(started(), just_failed)
    assert result.state == started()
    assert result.requeue_after_s == pytest.approx(4)


def test_the_next_attempt_waits_for_the_backoff_then_starts() -> None:
    resuming = step(started(), FAILED_JOB, AttemptRecords(preempted={"step": 4})).state
    early = step(resuming, None, now=NOW + timedelta(seconds=5))
    assert early.create_attempt is None
    assert early.requeue_after_s == pytest.approx(5)
    due = step(resuming, None, now=NOW + timedelta(seconds=10))
    assert due.create_attempt == 2
    assert due.state.current.ray_job == "r-a2"
    assert [a.attempt for a in due.state.attempts] == [1, 2]


def test_failure_backoff_doubles_with_each_failure() -> None:
    budget = {"maxPreemptions": 2, "maxFailures": 5, "backoffSeconds": 10}
    state = step(started(), FAILED_JOB, retry=budget).state
    assert state.next_attempt_time == "2026-11-23T12:00:10Z"
    state = step(state, None, now=NOW + timedelta(seconds=10), retry=budget).state
    state = step(state, FAILED_JOB, retry=budget).state
    assert state.next_attempt_time == "2026-11-23T12:00:20Z"


def test_exhausting_the_failure_budget_fails_the_run_with_a_clear_condition() -> None:
    state = step(started(), FAILED_JOB).state  # failure 1 of maxFailures=1: retried
    state = step(state, None, now=NOW + timedelta(seconds=60)).state  # attempt 2
    result = step(state, FAILED_JOB, now=NOW + timedelta(seconds=90))
    assert result.state.phase == "Failed"
    assert result.state.failures == 2
    assert "maxFailures=1" in result.state.message
    failed = next(c for c in conditions(result.state, [], 1, NOW) if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "FailureBudgetExhausted")
    assert [e.reason for e in result.events] == ["FailureBudgetExhausted"]


def test_preemptions_have_their_own_budget() -> None:
    state = started()
    preempted = AttemptRecords(preempted={"step": 1})
    for attempt in range(3):  # maxPreemptions=2: the third preemption ends the run
        now = NOW + timedelta(minutes=attempt)
        state = step(state, FAILED_JOB, preempted, now=now).state
        if state.phase == "Failed":
            break
        state = step(state, None, now=now + timedelta(seconds=30)).state
    assert state.phase == "Failed"
    assert (state.preemptions, state.failures) == (3, 0)
    assert "maxPreemptions=2" in state.message


def after_attempt(name: str, attempt: int) -> Plan:
    """The plan once attempt ``attempt`` of run ``name`` was preempted and its backoff is over."""
    document = {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": name}}
    document["spec"] = {
        "entrypoint": "python -m x",
        "checkpoint": {"uri": "s3://bkt/r"},
        "retry": {"maxPreemptions": 10**6},
    }
    ended = AttemptStatus(attempt=attempt, ray_job=rayjob_name(name, attempt), outcome="Preempted", reason="NodeLost")
    state = RunState(phase="Resuming", attempts=(ended,), preemptions=attempt, next_attempt_time="2026-11-23T11:00:00Z")
    return plan(Observation(parse_training_run(document), state, None), NOW)


def test_an_attempt_whose_rayjob_name_kuberay_would_refuse_fails_the_run_instead() -> None:
    # The longest name fits every attempt up to the reserved number (spotray/contract/spec.py) ...
    longest = "r" * MAX_NAME_LENGTH
    last = after_attempt(longest, MAX_RESERVED_ATTEMPT - 1)
    assert last.create_attempt == MAX_RESERVED_ATTEMPT
    assert len(last.state.current.ray_job) <= 47  # KubeRay v1.6.1's MaxRayJobNameLength
    # ... and the next one would make KubeRay set the RayJob ValidationFailed: the run fails, saying so.
    result = after_attempt(longest, MAX_RESERVED_ATTEMPT)
    assert result.create_attempt is None
    assert result.state.phase == "Failed"
    assert f"{longest}-a{MAX_RESERVED_ATTEMPT + 1}" in result.state.message
    assert "over 47" in result.state.message
    failed = next(c for c in conditions(result.state, [], 1, NOW) if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "RayJobNameTooLong")
    assert [e.reason for e in result.events] == ["RayJobNameTooLong"]
    # A shorter name has room for more digits.
    assert after_attempt("r" * 30, MAX_RESERVED_ATTEMPT).create_attempt == MAX_RESERVED_ATTEMPT + 1


def test_suspend_stops_the_attempt_and_unsuspend_starts_the_next() -> None:
    running = step(started(), RUNNING_JOB).state
    suspended = step(running, RUNNING_JOB, suspend=True)
    assert suspended.delete_rayjob == "r-a1"
    assert suspended.state.phase == "Suspended"
    assert suspended.state.current.outcome == "Suspended"
    assert (suspended.state.preemptions, suspended.state.failures) == (0, 0)
    again = step(suspended.state, None, suspend=True)
    # deleted again until gone: the controller may have stopped between recording and deleting
    assert (again.delete_rayjob, again.create_attempt) == ("r-a1", None)
    resumed = step(suspended.state, None)
    assert resumed.create_attempt == 2


def test_a_run_created_suspended_starts_nothing() -> None:
    result = step(RunState(), None, suspend=True)
    assert result.state.phase == "Suspended"
    assert result.create_attempt is None


def test_state_round_trips_through_the_status() -> None:
    state = step(started(), FAILED_JOB, AttemptRecords(preempted={"step": 4})).state
    status = state.to_status()
    status["conditions"] = [c.to_status() for c in conditions(state, [], 3, NOW)]
    assert RunState.from_status(status) == state
    assert status["attempt"] == 1
    assert status["preemptions"] == 1


def test_condition_transition_time_changes_only_when_the_status_does() -> None:
    state = started()
    first = conditions(state, [], 1, NOW)
    later = conditions(replace(state, phase="Running"), first, 2, NOW + timedelta(minutes=5))
    progressing = next(c for c in later if c.type == "Progressing")
    assert progressing.last_transition_time == "2026-11-23T12:00:00Z"
    assert progressing.reason == "Running"
    assert progressing.observed_generation == 2


INITIALIZING_JOB = RayJobView(job_status=None, deployment_status="Initializing")


def with_deadline(state: RunState, job: RayJobView, seconds_later: float):
    observation = Observation(run(), state, job, AttemptRecords(), settle_seconds=5, start_deadline_seconds=600)
    return plan(observation, NOW + timedelta(seconds=seconds_later))


def test_an_attempt_that_never_starts_ends_as_a_failure_at_the_start_deadline() -> None:
    waiting = with_deadline(started(), INITIALIZING_JOB, 599)
    assert waiting.state.phase == "Pending"
    assert waiting.delete_rayjob is None

    result = with_deadline(started(), INITIALIZING_JOB, 601)
    ended = result.state.attempts[-1]
    assert (ended.outcome, ended.reason) == ("Failed", "StartDeadlineExceeded")
    assert "did not start within 600 s (RayJob r-a1: Initializing)" in ended.message
    assert "kubectl get events" in ended.message
    assert result.delete_rayjob == "r-a1", "its pods (or their refusals) go with it"
    assert result.state.phase == "Resuming"
    assert result.state.failures == 1


def test_a_running_attempt_is_never_cut_by_the_start_deadline() -> None:
    assert with_deadline(started(), RUNNING_JOB, 10_000).state.phase == "Running"


def test_no_deadline_means_waiting() -> None:
    assert step(started(), INITIALIZING_JOB, now=NOW + timedelta(days=3)).state.phase == "Pending"


def test_the_pod_watcher_reads_when_a_pod_was_disrupted_and_a_garbled_time_is_no_time() -> None:
    pod = {
        "metadata": {"name": "w"},
        "spec": {"nodeName": "spot-1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-23T11:00:00Z"},
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "lastTransitionTime": "2026-11-23T11:58:00Z",
                },
            ]
        },
    }
    assert disruption_note(pod) == "pod w on node spot-1: DeletionByPodGC"
    assert disruption_time(pod) == "2026-11-23T11:58:00Z"
    pod["metadata"]["labels"] = {"ray.io/node-type": "head"}
    assert disruption_note(pod) == "the Ray head's pod w on node spot-1: DeletionByPodGC", "the head says so"
    job = {
        "status": {"jobStatus": "FAILED", "endTime": "2026-11-23T11:59:00Z"},
        "metadata": {"annotations": {DISRUPTION_ANNOTATION: "pod w", DISRUPTED_AT_ANNOTATION: "2026-11-23T11:58:00Z"}},
    }
    view = rayjob_view(job)
    assert view is not None
    assert view.disrupted_at == NOW - timedelta(minutes=2)
    assert view.lost_node_ended_it
    job["metadata"]["annotations"][DISRUPTED_AT_ANNOTATION] = "yesterday"
    garbled = rayjob_view(job)
    assert garbled is not None
    assert garbled.disrupted_at is None
    assert garbled.lost_node_ended_it, "no time to compare: the report stands"
