"""The job side of infrastructure faults: the crash-loop guard's verdict, what ``fit()`` raised, and
local mode's wait and words (the controller's side: tests/unit/test_infrastructure_faults.py)."""

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import ray.exceptions
from ray.train import ControllerError, WorkerGroupError
from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

from spotray.contract.attempts import AttemptId, AttemptRecords
from spotray.contract.errors import Cause, SpotrayError, StoreCredentialsError, StoreUnreachableError
from spotray.contract.spec import parse_training_run
from spotray.decisions.attempt_end import AttemptEnd, classify_end, end_attempt
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.run_state import RunState
from spotray.local.local_run import driver_message, pause_before_next_attempt
from spotray.train.launch.crash_loop import Crash, crash_loop_verdict
from spotray.train.launch.launcher import fit_failure_cause, outcome_after_fit, outcome_after_preemption
from spotray.train.records.attempt_records import write_outcome, write_preemption
from spotray.train.storage.store import open_store
from tests.lifecycle_runs import planned as plan

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def run():
    spec = {
        "entrypoint": "python -m spotray.jobs.gpt2",
        "checkpoint": {"uri": "s3://bkt/runs/r"},
        "retry": {"maxPreemptions": 2, "maxFailures": 1, "backoffSeconds": 10},
    }
    return parse_training_run(
        {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"}, "spec": spec}
    )


def started() -> RunState:
    return plan(Observation(run(), RunState(), None), NOW).state


@pytest.mark.parametrize(("cause", "code"), [(Cause.INFRASTRUCTURE, 75), (Cause.BAD_INPUT, 2), (Cause.TRAINING, 1)])
def test_a_crash_loop_ends_its_attempt_with_its_causes_code(tmp_path: Path, cause: Cause, code: int) -> None:
    """The guard counts only the training code's errors against maxFailures: a worker group that keeps
    failing on an unreachable store ends its attempt as an interruption, which the controller retries."""
    verdict = crash_loop_verdict([Crash(0, 20, f"{cause} error", cause)] * 3)
    assert verdict is not None
    assert verdict.cause is cause
    outcome = outcome_after_fit(open_store(str(tmp_path)), AttemptId("uid-1", 1), verdict)
    assert outcome.exit_code == code


def test_ray_trains_preemption_error_is_a_preemption_whose_record_says_if_the_checkpoint_is_complete(
    tmp_path: Path,
) -> None:
    """Nemesis trial 39: the drain deadline passed before the group stopped; a preemption either way,
    and the controller reads from the records whether the emergency checkpoint made it."""
    store, attempt = open_store(str(tmp_path)), AttemptId("uid-1", 1)
    late = outcome_after_preemption(store, attempt, RuntimeError("the deadline passed"))
    assert (late.exit_code, late.step) == (143, None)
    write_outcome(store, attempt, late)
    end = classify_end(
        RayJobView("FAILED", "Complete"), AttemptRecords(outcome={"exit_code": 143, "detail": late.detail})
    )
    assert (end.outcome, end.reason) == ("Preempted", "SpotNotice")
    assert end.message.startswith("preempted before its emergency checkpoint was complete (the deadline passed)")

    write_preemption(store, attempt, 37, 13.3)
    in_time = outcome_after_preemption(store, attempt, RuntimeError("the deadline passed"))
    assert (in_time.exit_code, in_time.step) == (143, 37)
    preempted = {"step": 37}
    end = classify_end(RayJobView("FAILED", "Complete"), AttemptRecords(outcome=None, preempted=preempted))
    assert end.message == "stopped on a preemption notice after an emergency checkpoint at step 37"


def test_a_crash_is_the_training_codes_unless_it_says_otherwise() -> None:
    assert Crash(0, None, "ValueError: bug").cause is Cause.TRAINING


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (ControllerError(StoreUnreachableError("could not reach", "f")), Cause.INFRASTRUCTURE),
        (ControllerError(StoreCredentialsError("refused", "f")), Cause.BAD_INPUT),
        (ControllerError(WorkerGroupStartupTimeoutError(2)), Cause.INFRASTRUCTURE),
        (ControllerError(ValueError("a bug in the dataset factory")), Cause.TRAINING),
        (ray.exceptions.ActorDiedError(), Cause.INFRASTRUCTURE),
        (ray.exceptions.NodeDiedError("node gone"), Cause.INFRASTRUCTURE),
        (ray.exceptions.GetTimeoutError("timed out"), Cause.INFRASTRUCTURE),
        (WorkerGroupError("rank 0 raised", {0: ValueError("bug")}), Cause.TRAINING),
        (SpotrayError("bad flag", "f"), Cause.BAD_INPUT),
        (ValueError("bug"), Cause.TRAINING),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_what_fit_raised_is_classified_with_rays_own_faults_as_infrastructure(error: BaseException, cause) -> None:
    assert fit_failure_cause(error) is cause


def test_local_mode_waits_the_backoff_only_after_an_interruption() -> None:
    """Local mode starts the next attempt at once after a preemption or failure (no capacity to wait
    for); after an infrastructure fault it waits as the controller does, or it would spin on a store that is down."""
    state = started()
    interrupted = AttemptEnd("Interrupted", "InfrastructureFault", "could not reach")
    assert pause_before_next_attempt(interrupted, end_attempt(state, run(), interrupted, NOW)) == 15
    failed = AttemptEnd("Failed", "TrainingFailed", "bug")
    assert pause_before_next_attempt(failed, end_attempt(state, run(), failed, NOW)) == 0
    preempted = AttemptEnd("Preempted", "SpotNotice", "notice")
    assert pause_before_next_attempt(preempted, end_attempt(state, run(), preempted, NOW)) == 0


def test_local_mode_tells_an_attempt_without_a_record_in_the_drivers_last_words(tmp_path: Path) -> None:
    """A driver that found its store hung exits 75 without a record: local mode's message about the
    attempt ends with the last lines of its log (what a RayJob's message holds on a cluster), from a
    whole line, so the user reads what the run waits for."""
    log = tmp_path / "attempt-1.log"
    log.write_text(
        "noise " * 1000 + "\nerror: could not reach http://127.0.0.1:9 to check bucket s3://b: Read timeout\n"
        "  fix: check that the S3 server is running\n"
    )
    message = driver_message(75, log)
    assert message.startswith(f"the driver exited with code 75 (log: {log}), which ends with:\nerror: could not reach")
    assert message.endswith("fix: check that the S3 server is running")
    assert "noise" not in message
    assert (
        driver_message(1, tmp_path / "no-such.log")
        == f"the driver exited with code 1 (log: {tmp_path / 'no-such.log'})"
    )

    end = classify_end(RayJobView("FAILED", "Complete", message, exit_code=75), AttemptRecords())
    assert (end.outcome, end.reason) == ("Interrupted", "InfrastructureFault")
    said = end_attempt(started(), run(), end, NOW).state.message
    assert "could not reach http://127.0.0.1:9" in said
    assert "waiting for the infrastructure" in said


def test_a_ray_without_ray_trains_private_fault_types_still_imports_the_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyproject allows Ray >= 2.50; where Ray Train's private exceptions module is missing, those faults
    count as the training code's (as before), and the launcher still imports."""
    from spotray.train.launch import launcher  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "ray.train.v2._internal.exceptions", None)  # import raises ImportError
    assert launcher._ray_train_internal_exceptions() is None
    assert launcher._exception_types(None, ("WorkerGroupStartupTimeoutError",)) == ()
    assert launcher._exception_types(launcher.ray.exceptions, ("NodeDiedError", "NoSuchError")) == (
        launcher.ray.exceptions.NodeDiedError,
    )
