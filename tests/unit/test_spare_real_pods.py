"""bench/on_testbed/spare_real_pods.py's reading of a run's progress: notice -> the next worker group's first step."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.on_testbed.recovery_real_pods import log_moment
from bench.on_testbed.spare_real_pods import first_group_after, notice_timeline
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit

NOTICE = 1000.0


def test_a_restart_inside_the_attempt_is_the_new_group_and_steps_after_its_checkpoint_are_redone() -> None:
    # With a spare: the old group trains on past the notice's checkpoint (step 12) until its node goes.
    attempt = AttemptProgress(attempt=1, run_id="r", started=900.0)
    attempt.points = [(step, 1.0, 990.0 + step) for step in range(1, 15)]  # steps 11-14 after the notice
    attempt.restarts = [(12, 1010.0)]
    attempt.points += [(13, 1.0, 1013.5), (14, 1.0, 1014.0)]
    found = first_group_after([attempt], NOTICE)
    assert found["notice_to_training_again_s"] == 13.5
    assert found["notice_to_new_group_s"] == 10.0
    assert (found["new_group_in_attempt"], found["resumed_from"]) == (1, 12)
    assert (found["last_step_before_the_new_group"], found["steps_redone_recorded"]) == (14, 2)


def test_without_a_spare_the_next_attempts_group_is_the_new_one() -> None:
    first = AttemptProgress(attempt=1, run_id="r", started=900.0, points=[(10, 1.0, 999.0), (11, 1.0, 1001.0)])
    second = AttemptProgress(attempt=2, run_id="r", started=1040.0, resumed_from=11, points=[(12, 1.0, 1047.5)])
    found = first_group_after([first, second], NOTICE)
    assert found["notice_to_training_again_s"] == 47.5
    assert (found["new_group_in_attempt"], found["resumed_from"], found["steps_redone_recorded"]) == (2, 11, 0)


def test_no_group_after_the_notice_is_an_error_not_a_figure() -> None:
    only = AttemptProgress(attempt=1, run_id="r", started=900.0, points=[(10, 1.0, 999.0)])
    with pytest.raises(RuntimeError, match="no worker group started after the notice"):
        first_group_after([only], NOTICE)


def test_the_notice_timeline_takes_each_milestone_after_the_one_before(tmp_path: Path) -> None:
    first, second = tmp_path / "a1.log", tmp_path / "a2.log"
    first.write_text(
        "2026-11-30T08:00:00.0Z (TrainController) Started training worker group of size 1:\n"  # before the notice
        "2026-11-30T08:00:13.5Z (RayTrainWorker) Rank 0 received preemption signal (...)\n"
        "2026-11-30T08:00:14.5Z (RayTrainWorker) emergency checkpoint-148 complete 0.6 s after the notice\n"
        "2026-11-30T08:00:20.6Z spotray.submitter: job none-1-a1-x ended: FAILED\n"
    )
    second.write_text(
        "2026-11-30T08:00:22.4Z spotray.submitter: job none-1-a2-y submitted\n"
        "2026-11-30T08:00:35.5Z (TrainController) Attempting to start training worker group of size 1\n"
        "2026-11-30T08:00:40.5Z (TrainController) Started training worker group of size 1:\n"
    )
    noticed = log_moment("2026-11-30T08:00:10.0Z")
    assert noticed is not None
    assert notice_timeline([first, second], noticed) == {
        "rank 0 has the notice": 3.5,
        "emergency checkpoint complete": 4.5,
        "Ray Train sees the worker gone": None,  # the attempt ended instead: no restart inside it
        "next driver submitted": 12.4,  # the next attempt's, not the line saying the last one ended
        "new worker group asked for": 25.5,
        "new worker group started": 30.5,
    }
