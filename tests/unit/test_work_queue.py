"""controller/work_queue.py: what is reconciled, in which order, how often."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from spotray.controller.work_queue import WorkQueue

pytestmark = pytest.mark.unit


class Recorder:
    """A reconcile that records its calls; ``hold`` makes it block until released."""

    def __init__(self, answer: float | None = None, seconds: float = 0.0) -> None:
        self.calls: list[tuple[str, dict[str, Any] | None, float]] = []
        self.answer = answer
        self.seconds = seconds
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0

    def __call__(self, namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
        with self.lock:
            self.calls.append((name, body, time.monotonic()))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return self.answer

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _, _ in self.calls]


def make_queue(reconcile: Any, **kwargs: Any) -> WorkQueue:
    settings: dict[str, Any] = {"interval_s": 0.2, "tick_s": 0.01, "workers": 4, "rng": random.Random(1)}
    return WorkQueue(reconcile, **{**settings, **kwargs})


def run_for(queue: WorkQueue, seconds: float) -> None:
    queue.start()
    time.sleep(seconds)
    queue.stop()


def test_active_runs_are_refreshed_about_every_interval_and_finished_ones_never() -> None:
    recorder = Recorder()
    queue = make_queue(recorder)
    queue.track("ns", "active", finished=False)
    queue.track("ns", "done", finished=True)
    run_for(queue, 0.75)
    assert 2 <= recorder.names().count("active") <= 6  # about 3-4; 2 on a loaded machine
    assert "done" not in recorder.names()


def test_a_run_that_finishes_or_is_deleted_is_dropped() -> None:
    recorder = Recorder()
    queue = make_queue(recorder, interval_s=0.1)
    queue.track("ns", "a", finished=False)
    queue.track("ns", "b", finished=False)
    queue.track("ns", "a", finished=True)
    queue.forget("ns", "b")
    run_for(queue, 0.4)
    assert recorder.calls == []
    assert queue.active() == 0


def test_new_runs_go_first_even_when_every_refresh_is_due() -> None:
    """Refreshes of 200 runs are all overdue; a new run added now still starts at once."""
    recorder = Recorder(seconds=0.2)
    queue = make_queue(recorder, interval_s=0.01, refreshes_per_second=1000, workers=4, refresh_workers=2)
    for index in range(200):
        queue.track("ns", f"old-{index}", finished=False)
    queue.start()
    time.sleep(0.3)  # the refreshes are well under way, two at a time
    added = time.monotonic()
    queue.add("ns", "new", {"metadata": {"name": "new"}})
    time.sleep(0.3)
    queue.stop()
    new_calls = [(body, at) for name, body, at in recorder.calls if name == "new"]
    assert new_calls, "the new run was never reconciled"
    body, started = new_calls[0]
    assert body == {"metadata": {"name": "new"}}  # the watch's body, saving a read
    # Two workers are free for urgent work, so it starts without waiting for a refresh to end.
    assert started - added < 0.15  # a refresh takes 0.2 s: it did not wait for one
    assert recorder.most_running <= 3  # two refreshes and the new run, never more refreshes


def test_refreshes_are_rate_limited_and_the_interval_grows_with_the_runs() -> None:
    recorder = Recorder()
    queue = make_queue(recorder, interval_s=0.1, refreshes_per_second=20, workers=4)
    for index in range(10):
        queue.track("ns", f"run-{index}", finished=False)
    assert queue.interval_s() == pytest.approx(0.5)  # 10 runs at 20/s: each every 0.5 s, not 0.1 s
    run_for(queue, 1.5)
    # At most the bucket's burst (20) plus 20/s; without the limit it would be about 150.
    assert len(recorder.calls) <= 20 + 20 * 1.5
    assert len(recorder.calls) >= 15  # and every run is still refreshed
    assert set(recorder.names()) == {f"run-{index}" for index in range(10)}


def test_requests_for_a_run_being_reconciled_are_done_after_it_once() -> None:
    """A burst of events for one run costs at most one more reconcile, and the last one reads fresh."""
    recorder = Recorder(seconds=0.1)
    queue = make_queue(recorder, interval_s=60)
    queue.start()
    queue.add("ns", "r", {"metadata": {"name": "r"}})
    time.sleep(0.03)  # the first reconcile is running
    for _ in range(5):
        queue.add("ns", "r", {"metadata": {"name": "r", "stale": True}})
    time.sleep(0.4)
    queue.stop()
    assert recorder.names() == ["r", "r"]
    assert recorder.most_running == 1  # never two reconciles of one run at once
    assert recorder.calls[1][1] is None  # several requests were merged: read the object fresh


def test_a_shorter_requeue_is_honoured_and_a_failure_is_retried() -> None:
    calls: list[float] = []

    def flaky(namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("API server hiccup")
        return 0.05  # e.g. a backoff that ends soon

    queue = make_queue(flaky, interval_s=0.3)
    queue.track("ns", "r", finished=False)
    queue.add("ns", "r")
    run_for(queue, 1.0)
    # The failed first one is retried after min(interval, 1 s) = 0.3 s, then every ~0.05 s.
    assert len(calls) >= 6
    assert calls[1] - calls[0] >= 0.25


def test_a_lifecycle_timer_is_not_held_back_by_the_refresh_limit() -> None:
    """A backoff that ran out starts the next attempt: it is urgent, not a rate-limited refresh."""
    times: dict[str, list[float]] = {"timer": [], "other": []}

    def reconcile(namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
        times[name].append(time.monotonic())
        return 0.05 if name == "timer" else None

    queue = make_queue(reconcile, interval_s=0.05, refreshes_per_second=1)
    queue.track("ns", "other", finished=False)
    queue.track("ns", "timer", finished=False)
    queue.add("ns", "timer")
    run_for(queue, 0.6)
    assert len(times["timer"]) >= 6  # every ~0.05 s, though refreshes get one token a second
    assert len(times["other"]) <= 2


def test_refresh_workers_must_leave_room_for_urgent_work() -> None:
    with pytest.raises(ValueError, match="refresh_workers"):
        WorkQueue(Recorder(), interval_s=1, workers=2, refresh_workers=2)


def test_refreshes_wait_while_new_runs_are_queued_and_the_backlog_is_counted() -> None:
    """While urgent requests wait for a worker, no refresh starts: their API calls go first."""
    started_refreshes: list[float] = []
    release = threading.Event()

    def reconcile(namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
        if name.startswith("new"):
            release.wait(2)  # the one urgent worker is busy until released
        else:
            started_refreshes.append(time.monotonic())
        return None

    queue = make_queue(reconcile, interval_s=0.01, workers=3, refresh_workers=2)
    queue.track("ns", "old", finished=False)
    queue.start()
    time.sleep(0.2)
    assert started_refreshes  # refreshing while nothing is urgent
    queue.add("ns", "new")
    time.sleep(0.05)
    queue.add("ns", "new")  # waits for the first to end; two workers are free meanwhile
    assert queue.backlog() == 2  # one being reconciled, one waiting: a burst
    paused_at = time.monotonic()
    time.sleep(0.3)
    during = [at for at in started_refreshes if at > paused_at]
    release.set()
    time.sleep(0.3)
    queue.stop()
    assert during == []
    assert queue.backlog() == 0
    assert started_refreshes[-1] > paused_at  # and they resume after


def test_refreshes_held_back_by_their_limits_never_hold_up_a_timer_due_after_them() -> None:
    """Refreshes are overdue but both refresh workers are busy; a backoff that ran out later than
    they fell due still starts at once on a free worker (no head-of-line blocking)."""
    times: list[float] = []

    def reconcile(namespace: str, name: str, body: dict[str, Any] | None) -> float | None:
        if name != "timer":
            time.sleep(0.3)  # a slow refresh (S3 far away)
            return None
        times.append(time.monotonic())
        return 0.1 if len(times) == 1 else None  # the lifecycle asks for another look in 0.1 s

    queue = make_queue(reconcile, interval_s=0.2, refreshes_per_second=1000, workers=4, refresh_workers=2)
    for index in range(20):
        queue.track("ns", f"old-{index}", finished=False)
    queue.start()
    time.sleep(0.3)  # two refreshes run (0.3 s each), the others are due and wait for a refresh worker
    queue.track("ns", "timer", finished=False)
    queue.add("ns", "timer")
    time.sleep(0.5)
    queue.stop()
    assert len(times) == 2
    assert times[1] - times[0] < 0.2
