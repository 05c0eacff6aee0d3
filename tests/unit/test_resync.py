"""controller/resync.py: which runs get looked at, and when."""

import threading
import time

import pytest

from spotray.controller.resync import Resync

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, answer: float | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answer = answer
        self.lock = threading.Lock()

    def __call__(self, namespace: str, name: str) -> float | None:
        with self.lock:
            self.calls.append((namespace, name))
        return self.answer


def run_for(resync: Resync, seconds: float) -> None:
    resync.start()
    time.sleep(seconds)
    resync.stop()


def test_active_runs_are_reconciled_every_interval_and_finished_ones_never() -> None:
    recorder = Recorder()
    resync = Resync(recorder, interval_s=0.2, tick_s=0.02)
    resync.track("ns", "active", "Running")
    resync.track("ns", "done", "Succeeded")
    run_for(resync, 0.75)
    assert 2 <= recorder.calls.count(("ns", "active")) <= 4
    assert ("ns", "done") not in recorder.calls


def test_a_run_that_finishes_or_is_deleted_is_dropped() -> None:
    recorder = Recorder()
    resync = Resync(recorder, interval_s=0.1, tick_s=0.02)
    resync.track("ns", "a", "Running")
    resync.track("ns", "b", "Running")
    resync.track("ns", "a", "Failed")
    resync.forget("ns", "b")
    run_for(resync, 0.4)
    assert recorder.calls == []
    assert resync.active() == 0


def test_a_shorter_requeue_is_honoured_and_errors_do_not_stop_the_loop() -> None:
    calls: list[float] = []

    def flaky(namespace: str, name: str) -> float | None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("API server hiccup")
        return 0.05  # e.g. a backoff that ends soon

    resync = Resync(flaky, interval_s=0.3, tick_s=0.02)
    resync.track("ns", "r", "Resuming")
    run_for(resync, 1.0)
    assert len(calls) >= 4  # first after 0.3 s, the failed one retried after 0.3 s, then every ~0.05 s
