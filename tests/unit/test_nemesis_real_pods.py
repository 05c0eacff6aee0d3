"""The real-pods nemesis's own checks (bench/nemesis_real_pods.py): where each restart resumed, and
what a notice on a real node allows. The rest of its checker is bench/nemesis.py's (test_nemesis_checker.py).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from bench.nemesis import Landing, draw_faults, outcomes_allowed
from bench.nemesis_real_pods import (
    KINDS_ON_REAL_PODS,
    REAL_PODS_PACE,
    SIGNAL_JOB,
    emergency_step,
    newest_complete,
    resumes_judged,
    steps_lost,
)
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME

pytestmark = pytest.mark.unit

NOTICE = "stopped on a preemption notice after an emergency checkpoint at step 57"


def attempt(number: int, outcome: str, reason: str, message: str = "", **extra: object) -> dict[str, object]:
    return {"attempt": number, "outcome": outcome, "reason": reason, "message": message, **extra}


def test_the_emergency_step_is_read_from_a_notice_s_message_only() -> None:
    assert emergency_step(NOTICE) == 57
    assert emergency_step("preempted before its emergency checkpoint was complete") is None
    assert emergency_step("") is None


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


def test_a_restart_from_the_newest_complete_checkpoint_passes() -> None:
    attempts = [
        attempt(1, "Preempted", "SpotNotice", NOTICE),
        attempt(2, "Succeeded", "TrainingFinished", resumedFrom=57),
    ]
    assert resumes_judged(attempts, {1: 0, 2: 57}) == []


def test_a_restart_from_an_older_checkpoint_than_the_newest_complete_one_fails() -> None:
    attempts = [
        attempt(1, "Preempted", "NodeLost"),
        attempt(2, "Succeeded", "TrainingFinished", resumedFrom=20),
    ]
    assert resumes_judged(attempts, {1: 0, 2: 40}) == ["attempt 2 resumed from 20, but checkpoint-40 was complete"]


def test_a_succeeded_attempt_that_started_afresh_though_a_checkpoint_was_complete_fails() -> None:
    attempts = [attempt(1, "Failed", "TrainingFailed"), attempt(2, "Succeeded", "TrainingFinished")]
    assert resumes_judged(attempts, {2: 60}) == ["attempt 2 resumed from 0, but checkpoint-60 was complete"]


def test_a_restart_after_a_notice_must_take_its_emergency_checkpoint() -> None:
    attempts = [
        attempt(1, "Preempted", "SpotNotice", NOTICE),
        attempt(2, "Succeeded", "TrainingFinished", resumedFrom=60),
    ]
    assert resumes_judged(attempts, {2: 40}) == ["attempt 2 resumed from 60, not the emergency checkpoint 57"]


def test_an_attempt_that_ended_before_it_said_where_it_resumed_is_not_judged_on_it() -> None:
    attempts = [
        attempt(1, "Preempted", "SpotNotice", NOTICE),
        attempt(2, "Interrupted", "InfrastructureFault"),  # no resumedFrom: it never trained
        attempt(3, "Succeeded", "TrainingFinished", resumedFrom=57),
    ]
    assert resumes_judged(attempts, {2: 57, 3: 57}) == []


def test_steps_lost_are_the_steps_seen_past_the_next_attempt_s_resume_point() -> None:
    attempts = [
        attempt(1, "Preempted", "NodeLost"),
        attempt(2, "Preempted", "SpotNotice", NOTICE, resumedFrom=40),
        attempt(3, "Succeeded", "TrainingFinished", resumedFrom=57),
    ]
    assert steps_lost(attempts, {1: 52, 2: 57, 3: 120}) == [12, 0]


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
