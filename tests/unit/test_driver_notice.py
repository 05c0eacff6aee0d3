"""The driver's own SIGTERM drains every node and bounds what follows (train/launch/driver_notice.py)."""

import signal
import subprocess
import sys
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


def test_on_a_cluster_that_outlives_the_attempt_the_sigterm_drains_nothing_and_ends_the_driver() -> None:
    """``stop_without_drain``: the process ends as SIGTERM ends it, saying why, and no drain is asked
    for (driver_notice.py imports no Ray; the drain would come through ``DriverNotice``)."""
    script = (
        "import os, signal, time\n"
        "from spotray.train.launch.driver_notice import stop_without_drain\n"
        "stop_without_drain()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
        "print('still running')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert "drains no node" in done.stderr
    assert "still running" not in done.stdout


def test_the_launcher_drains_only_a_cluster_of_the_attempts_own(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = pytest.importorskip("spotray.train.launch.launcher")
    from spotray.contract.spec import RunContext, parse_spec  # noqa: PLC0415

    installed: list[object] = []
    monkeypatch.setattr(signal, "signal", lambda _signum, handler: installed.append(handler))
    spec = parse_spec({"entrypoint": "x", "checkpoint": {"uri": "s3://bucket/runs/r"}})
    own = launcher.install_driver_sigterm(RunContext("r", "local-r", 1, spec), None, 30, 60.0)
    assert installed == [own.on_sigterm]
    installed.clear()
    kept = RunContext("r", "local-r", 1, spec, ray_cluster_outlives_attempt=True)
    launcher.install_driver_sigterm(kept, None, 30, 60.0)
    assert len(installed) == 1
    assert getattr(installed[0], "__qualname__", "").startswith("stop_without_drain")
