"""The real-pods nemesis's own checks (bench/campaigns/nemesis_real_pods.py): where each restart resumed, and
what a notice on a real node allows. The rest of its checker is bench/campaigns/nemesis.py's (test_nemesis_checker.py).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from bench.campaigns.nemesis import Landing, draw_faults, outcomes_allowed
from bench.campaigns.nemesis_real_pods import (
    KINDS_ON_REAL_PODS,
    REAL_PODS_PACE,
    RESUME_DECIDED_S,
    SIGNAL_JOB,
    emergency_resumes,
    emergency_step,
    is_progress_key,
    kinds_judged,
    newest_complete,
    resumes_judged,
)
from spotray.contract.attempts import AttemptId
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME

pytestmark = pytest.mark.unit

NOTICE = "stopped on a preemption notice after an emergency checkpoint at step 57"


def attempt(number: int, outcome: str, reason: str, message: str = "", **extra: object) -> dict[str, object]:
    return {"attempt": number, "outcome": outcome, "reason": reason, "message": message, **extra}


def test_the_emergency_step_is_read_from_a_notice_s_message_only() -> None:
    assert emergency_step(NOTICE) == 57
    assert emergency_step("preempted before its emergency checkpoint was complete") is None
    assert emergency_step("") is None


def test_the_progress_records_are_found_by_the_key_the_jobs_write() -> None:
    attempt_id = AttemptId("run-uid-1234", 12)
    assert is_progress_key(attempt_id.progress_key)
    assert not is_progress_key(attempt_id.outcome_key)
    assert not is_progress_key(attempt_id.preemption_key)
    assert not is_progress_key("checkpoint-20/trainer_state.json")
    assert not is_progress_key(attempt_id.progress_key + ".tmp")


def test_the_newest_complete_checkpoint_is_the_newest_with_its_manifest() -> None:
    keys = [
        f"checkpoint-20/{MANIFEST_NAME}",
        "checkpoint-20/model.safetensors",
        "checkpoint-40/model.safetensors",  # being written: no manifest yet
        f"checkpoint-100/{MANIFEST_NAME}x",  # not the manifest's name
        "attempt-1.json",
    ]
    assert newest_complete(keys) == 20
    assert newest_complete([]) == 0


# The store as the campaign listed it: (unix time, the newest complete checkpoint then).
LISTED = [(100.0, 0), (110.0, 20), (120.0, 40), (130.0, 40), (140.0, 60)]


def test_worker_groups_that_resumed_from_the_newest_complete_checkpoint_pass() -> None:
    starts = [(1, 0, 90.0), (1, 40, 127.0), (2, 60, 150.0)]  # attempt 1, a restart inside it, attempt 2
    assert resumes_judged(starts, LISTED) == []


def test_a_restart_inside_an_attempt_from_an_older_checkpoint_fails() -> None:
    starts = [(1, 0, 90.0), (1, 20, 131.0)]  # checkpoint-40 was listed complete at 120 s
    assert resumes_judged(starts, LISTED) == [
        "a worker group of attempt 1 resumed from 20, but checkpoint-40 was complete"
    ]


def test_a_new_attempt_that_started_afresh_though_a_checkpoint_was_complete_fails() -> None:
    assert resumes_judged([(2, 0, 150.0)], LISTED) == [
        "a worker group of attempt 2 resumed from 0, but checkpoint-60 was complete"
    ]


def test_a_checkpoint_listed_just_before_a_group_started_was_not_there_when_it_chose() -> None:
    # Listed at 140 s; the group that started at 143 s chose its checkpoint before RESUME_DECIDED_S.
    assert resumes_judged([(2, 40, 140.0 + RESUME_DECIDED_S - 2)], LISTED) == []
    assert resumes_judged([(2, 40, 140.0 + RESUME_DECIDED_S)], LISTED) != []


def test_a_restart_after_a_notice_must_take_its_emergency_checkpoint() -> None:
    notice = attempt(1, "Preempted", "SpotNotice", NOTICE)
    assert emergency_resumes([notice, attempt(2, "Succeeded", "TrainingFinished", resumedFrom=57)]) == []
    assert emergency_resumes([notice, attempt(2, "Succeeded", "TrainingFinished", resumedFrom=60)]) == [
        "attempt 2 resumed from 60, not the emergency checkpoint 57"
    ]
    # One that ended before it said where it resumed is not judged on it.
    assert emergency_resumes([notice, attempt(2, "Interrupted", "InfrastructureFault")]) == []


def test_a_worker_lost_without_notice_may_be_replaced_inside_its_attempt() -> None:
    lost = Landing("node-lost", "step", [1], 18, "between checkpoints", 70.0)
    for judged in (("Succeeded", "TrainingFinished"), ("Preempted", "NodeLost")):
        assert outcomes_allowed([attempt(1, *judged)], [lost], REAL_PODS_PACE, KINDS_ON_REAL_PODS) == []
    failed = [attempt(1, "Failed", "TrainingFailed")]
    assert outcomes_allowed(failed, [lost], REAL_PODS_PACE, KINDS_ON_REAL_PODS) != []


def test_a_reclaim_in_the_last_interval_may_find_the_job_finished_as_a_notice_may() -> None:
    late = REAL_PODS_PACE.steps - REAL_PODS_PACE.every  # the drain may take longer than the steps left
    reclaim = Landing("spot-reclaim", "step", [1], late + 1, "between checkpoints", 30.0)
    finished = [attempt(1, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(finished, [reclaim], REAL_PODS_PACE, KINDS_ON_REAL_PODS) == []
    early = Landing("spot-reclaim", "step", [1], 10, "between checkpoints", 30.0)
    problems = outcomes_allowed(finished, [early], REAL_PODS_PACE, KINDS_ON_REAL_PODS)
    assert len(problems) == 1
    assert "spot-reclaim at step 10" in problems[0]
    # Either judgement of a reclaim is fair: the drain's emergency checkpoint, or the node gone first.
    for reason in ("SpotNotice", "NodeLost"):
        judged = [attempt(1, "Preempted", reason)]
        assert outcomes_allowed(judged, [early], REAL_PODS_PACE, KINDS_ON_REAL_PODS) == []


def test_with_a_spare_an_early_reclaim_may_let_the_attempt_finish_and_without_one_it_may_not() -> None:
    early = Landing("spot-reclaim", "step", [1], 10, "between checkpoints", 30.0)
    finished = [attempt(1, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(finished, [early], REAL_PODS_PACE, kinds_judged(False, spares=True)) == []
    assert outcomes_allowed(finished, [early], REAL_PODS_PACE, kinds_judged(True, spares=True)) == []
    assert outcomes_allowed(finished, [early], REAL_PODS_PACE, kinds_judged(False)) != []
    # No room (the spare not joined yet): the notice ends the attempt, as without spares.
    preempted = [attempt(1, "Preempted", "SpotNotice")]
    assert outcomes_allowed(preempted, [early], REAL_PODS_PACE, kinds_judged(True, spares=True)) == []
    failed = [attempt(1, "Failed", "TrainingFailed")]
    assert outcomes_allowed(failed, [early], REAL_PODS_PACE, kinds_judged(True, spares=True)) != []


def test_faults_are_drawn_from_the_real_pods_kinds_only() -> None:
    for number in range(200):
        rng = random.Random(number)
        lead = list(KINDS_ON_REAL_PODS)[number % len(KINDS_ON_REAL_PODS)]
        faults = draw_faults(rng, REAL_PODS_PACE, lead, KINDS_ON_REAL_PODS)
        assert lead in [f.kind for f in faults]
        assert all(f.kind in KINDS_ON_REAL_PODS for f in faults)
        for fault in faults:
            if fault.trigger == "start":
                assert KINDS_ON_REAL_PODS[fault.kind].scope == "cluster"


@pytest.fixture
def fake_job() -> Iterator[tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A job's two processes as Ray runs them: a shell whose command line names the module, and the
    Python driver with the module as one word of its argv (a unique word: no real job is touched)."""
    word = f"spotray-fake-job-{uuid.uuid4().hex}"
    shell = subprocess.Popen(["sh", "-c", f"sleep 60; true {word}"])
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", word])
    yield word, shell, driver
    for process in (shell, driver):
        process.kill()
        process.wait()


def signal_job(word: str, sig: signal.Signals, every: bool) -> list[int]:
    args = [str(int(sig)), "all" if every else "driver", word]
    done = subprocess.run([sys.executable, "-c", SIGNAL_JOB, *args], capture_output=True, text=True, check=True)
    return [int(pid) for pid in done.stdout.split()]


def test_a_notice_goes_to_the_driver_alone(
    fake_job: tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]],
) -> None:
    word, shell, driver = fake_job
    assert signal_job(word, signal.SIGTERM, every=False) == [driver.pid]
    assert driver.wait(timeout=10) == -signal.SIGTERM
    assert shell.poll() is None


def test_a_killed_job_loses_its_shell_and_its_driver_and_the_script_spares_itself(
    fake_job: tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]],
) -> None:
    word, shell, driver = fake_job
    assert sorted(signal_job(word, signal.SIGKILL, every=True)) == sorted([shell.pid, driver.pid])
    assert shell.wait(timeout=10) == driver.wait(timeout=10) == -signal.SIGKILL
    assert signal_job(word, signal.SIGKILL, every=True) == []  # nothing left, and it did not kill itself


def test_an_attempt_that_survived_a_lost_worker_may_end_by_the_next_run_fault() -> None:
    """Trial 3 of seed 1: the worker's node lost at step 27 (replaced inside attempt 1), then a reclaim
    at step 67 ended attempt 1 with its emergency checkpoint."""
    lost = Landing("node-lost-controller-down", "step", [1], 27, "between checkpoints", 80.0)
    reclaimed = Landing("spot-reclaim", "step", [1], 67, "between checkpoints", 334.0, reached=76)
    attempts = [attempt(1, "Preempted", "SpotNotice", NOTICE), attempt(2, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(attempts, [lost, reclaimed], REAL_PODS_PACE, KINDS_ON_REAL_PODS) == []
    failed = [attempt(1, "Failed", "TrainingFailed"), attempts[1]]
    [problem] = outcomes_allowed(failed, [lost, reclaimed], REAL_PODS_PACE, KINDS_ON_REAL_PODS)
    assert "node-lost-controller-down at step 27, spot-reclaim at step 67 allows" in problem
