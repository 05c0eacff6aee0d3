"""The gpt2 job's --min-step-seconds: each step lasts at least that long, by sleeping; off by default.

The nemesis campaign paces its tiny model with it, so a fault drawn for a step lands near that step.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.unit

gpt2 = pytest.importorskip("spotray.jobs.gpt2.train", reason="the job's packages (the [train] extra)")
gpt2_config = pytest.importorskip("spotray.jobs.gpt2.config", reason="the job's packages (the [train] extra)")


def test_a_step_lasts_at_least_the_floor_and_a_slower_one_is_not_slowed_more() -> None:
    floor = gpt2.StepFloor(0.2)
    began = time.monotonic()
    floor.on_step_begin(None, None, None)
    floor.on_step_end(None, None, None)
    assert time.monotonic() - began >= 0.2

    floor.on_step_begin(None, None, None)
    time.sleep(0.3)  # a step slower than the floor
    before_end = time.monotonic()
    floor.on_step_end(None, None, None)
    assert time.monotonic() - before_end < 0.05


def test_the_floor_is_off_unless_asked_and_never_negative(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpt2_config.parse_args([]).min_step_seconds == 0.0
    assert gpt2_config.parse_args(["--min-step-seconds", "0.3"]).min_step_seconds == 0.3
    with pytest.raises(SystemExit):
        gpt2_config.parse_args(["--min-step-seconds", "-1"])
    assert "--min-step-seconds must be >= 0" in capsys.readouterr().err
