"""The GPU checkpoint benchmark's throughput window holds every save it times (issue 74)."""

from __future__ import annotations

import pytest

from bench.gpu.gpu_checkpoint import steps_per_s

pytestmark = pytest.mark.unit


def test_the_last_steps_save_is_inside_the_window() -> None:
    # Steps of 1 s; the Trainer saves after step 10's on_step_end, for 4 s.
    step_end = {step: float(step) for step in range(11)}
    save_end = {5: 5.5, 10: 14.0}
    # 5 steps after step 5, over 14 - 5 = 9 s (the window the first runs used ended at 10 s).
    assert steps_per_s(step_end, save_end, 5, 10) == pytest.approx(5 / 9)


def test_without_saves_the_window_ends_at_the_last_step() -> None:
    step_end = {step: float(step) for step in range(11)}
    assert steps_per_s(step_end, {}, 5, 10) == pytest.approx(1.0)
