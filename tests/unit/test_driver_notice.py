"""The driver's own SIGTERM drains every node and bounds what follows (train/launch/driver_notice.py)."""

import signal
import threading
import time

import pytest

from spotray.train.launch.driver_notice import DriverNotice

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self) -> None:
        self.drains: list[tuple[str, int]] = []
        self.overdue: list[float] = []
        self.called = threading.Event()

    def drain(self, reason: str, grace_seconds: int) -> int:
        self.drains.append((reason, grace_seconds))
        return 2

    def on_overdue(self, waited_s: float) -> None:
        self.overdue.append(waited_s)
        self.called.set()


def test_a_fit_that_never_ends_after_the_sigterm_is_ended_past_the_deadline_and_margin() -> None:
    """Nemesis trial 39: an elastic group's restart on drained nodes would wait for ever."""
    seen = Recorder()
    notice = DriverNotice(0, seen.drain, seen.on_overdue, margin_s=0.3)
    assert not notice.received
    started = time.monotonic()
    notice.on_sigterm(signal.SIGTERM, None)
    assert notice.received
    assert seen.drains == [("spotray: SIGTERM received by the driver", 0)]
    assert seen.called.wait(10), "the bound never fired"
    assert time.monotonic() - started >= 0.3
    assert len(seen.overdue) == 1
    assert seen.overdue[0] >= 0.3


def test_a_fit_that_ends_in_time_is_left_alone_and_a_second_sigterm_drains_again_without_a_second_bound() -> None:
    seen = Recorder()
    notice = DriverNotice(0, seen.drain, seen.on_overdue, margin_s=0.3)
    notice.on_sigterm(signal.SIGTERM, None)
    notice.on_sigterm(signal.SIGTERM, None)
    notice.fit_ended()
    assert not seen.called.wait(1.0)
    assert seen.overdue == []
    assert len(seen.drains) == 2


def test_no_sigterm_no_bound() -> None:
    seen = Recorder()
    notice = DriverNotice(0, seen.drain, seen.on_overdue, margin_s=0.0)
    notice.fit_ended()
    assert not notice.received
    assert not seen.called.wait(0.3)
