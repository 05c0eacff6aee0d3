"""status.progress from an attempt's progress object (controller/run_store.py ``progress_status``).

Found by the nemesis smoke: attempt 1 finished its 30 steps and was cut short before its last
progress write (it showed step 1); attempt 2 resumed from checkpoint-30 and had no step left to
log, so the finished run's status said "step 1 of 30" next to its last checkpoint at 30.
"""

from __future__ import annotations

import pytest

from spotray.controller.run_store import progress_status
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit


def test_an_attempt_that_resumed_and_logged_no_step_is_at_its_resume_point() -> None:
    resumed = AttemptProgress(attempt=2, run_id="r", resumed_from=30, max_steps=30, started=1_795_773_178.0)
    progress, resumed_from = progress_status(resumed)
    assert progress is not None
    assert (progress.step, progress.total_steps, progress.loss) == (30, 30, None)
    assert progress.update_time is not None
    assert resumed_from == 30


def test_a_fresh_attempt_with_no_step_yet_reports_nothing_and_a_logged_step_wins() -> None:
    assert progress_status(AttemptProgress(attempt=1, run_id="r", max_steps=30)) == (None, None)
    assert progress_status(None) == (None, None)
    logged = AttemptProgress(attempt=2, run_id="r", resumed_from=20, max_steps=30, updated=1.0, points=[(24, 2.5, 1.0)])
    progress, resumed_from = progress_status(logged)
    assert progress is not None
    assert (progress.step, progress.loss, resumed_from) == (24, 2.5, 20)
