"""train/progress_log.py: each attempt's progress object, written and read back through a store."""

from pathlib import Path

import pytest

from spotray.train.progress_log import AttemptProgress, ProgressWriter, read_attempt_progress, read_run_progress
from spotray.train.store import open_store

pytestmark = [pytest.mark.unit, pytest.mark.core]


def test_progress_is_written_every_interval_and_read_back_per_attempt(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    first = ProgressWriter(store, AttemptProgress(attempt=1, max_steps=100, world_size=2), interval_s=3600)
    first.record(1, 5.0)  # the first point is written at once (nothing written yet)
    first.record(2, 4.0)  # within the interval: kept in memory only
    assert read_attempt_progress(store, 1).points == [(1, 5.0, pytest.approx(first.progress.points[0][2]))]
    first.flush()
    second = ProgressWriter(store, AttemptProgress(attempt=2, resumed_from=2, max_steps=100), interval_s=0)
    second.record(3, 3.5)

    history = read_run_progress(store)

    assert [p.attempt for p in history] == [1, 2]
    assert [step for step, _, _ in history[0].points] == [1, 2]
    assert history[1].resumed_from == 2
    assert (history[1].last_step, history[1].last_loss) == (3, 3.5)
    assert read_attempt_progress(store, 3) is None


def test_speed_needs_two_points() -> None:
    progress = AttemptProgress(attempt=1, points=[(10, 1.0, 100.0)])
    assert progress.steps_per_second() is None
    progress.points.append((30, 0.9, 110.0))
    assert progress.steps_per_second() == pytest.approx(2.0)


def test_an_unreadable_progress_object_is_ignored(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    store.put_bytes("_spotray/attempt-1.progress.json", b"{not json")
    assert read_attempt_progress(store, 1) is None
    assert read_run_progress(store) == []
