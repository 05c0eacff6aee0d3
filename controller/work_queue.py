"""The controller's work queue: which TrainingRun is reconciled next, on which thread, how often.

Two kinds of work share one pool of worker threads:
- urgent: a new run or a spec change (from the watch), a RayJob that finished, and a timer the
  lifecycle asked for (a backoff that ran out, a settle wait; one asked for later than the next
  refresh is left to that refresh). These create or end attempts, so any free worker takes them
  first: requests in arrival order, then timers, each on a heap of its own so that refreshes held
  back by their limits never hold a timer up.
- refresh: the periodic look at every active run (progress and checkpoints from S3, the start
  deadline, a missed event). At most ``refresh_workers`` refreshes run at once, at most
  ``refreshes_per_second`` start, and none starts while urgent requests wait, so a thousand active
  runs never crowd out a new one. Each run is
  refreshed every ``max(interval_s, active runs / refreshes_per_second)`` seconds with +-10%
  jitter: the rate holds as runs are added (1,000 runs at 10/s: every 100 s), and runs created in
  one burst do not come back in one wave.
A run is queued at most once and reconciled by one worker at a time. A request for a run that is
being reconciled is kept and done right after, as in client-go's workqueue: a burst of events for
one run costs one or two reconciles, and no change is lost. A failed reconcile is retried with a
per-run backoff (1 s doubling up to the interval), not dropped.

kopf's own timers would do the periodic part, but a kopf timer puts a finalizer on every object:
each new run then waits for an extra write and watch round trip before its first handler, and
deleting a run hangs whenever the controller is down. With kopf peering (HA, several replicas)
the handlers use kopf's timer instead, which kopf pauses on the standby replicas
(controller/handlers.py).
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotray.controller import metrics

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
Body = dict[str, Any] | None  # the object as the watch delivered it, or None: read it fresh
Reconcile = Callable[[str, str, Body], float | None]  # -> seconds until it wants another look, or None
JITTER = 0.1
REQUEST, TIMER, REFRESH = "request", "timer", "refresh"  # the kinds of work, most urgent first
FIRST_RETRY_S = 1.0


@dataclass
class _Tracked:
    """An active run: when it is next looked at, and whether that look is the lifecycle's own timer."""

    due: float
    timer: bool = False
    failures: int = 0


class WorkQueue:
    """Reconciles runs on ``workers`` threads: urgent requests first, then rate-limited refreshes."""

    def __init__(
        self,
        reconcile: Reconcile,
        *,
        interval_s: float,
        refreshes_per_second: float = 10.0,
        workers: int = 16,
        refresh_workers: int = 2,
        tick_s: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if refresh_workers >= workers:
            raise ValueError("refresh_workers must leave at least one worker for urgent reconciles")
        self._reconcile = reconcile
        self._interval_s = interval_s
        self._rate = refreshes_per_second
        self._refresh_workers = refresh_workers
        self._tick_s = tick_s
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self._urgent: dict[Key, Body] = {}  # insertion order is arrival order
        self._tracked: dict[Key, _Tracked] = {}
        # (due, key) of the lifecycle's timers and of refreshes, apart so that a refresh held back by
        # its limits never holds a timer up; stale entries are skipped when they come up.
        self._timers: list[tuple[float, Key]] = []
        self._refreshes: list[tuple[float, Key]] = []
        self._busy: set[Key] = set()
        self._refreshing = 0
        self._urgent_running = 0  # requests (not timers) being reconciled now
        self._tokens = 1.0
        self._tokens_at = time.monotonic()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"spotray-worker-{index}", daemon=True) for index in range(workers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ what the handlers call

    def add(self, namespace: str, name: str, body: Body = None) -> None:
        """Reconcile this run as soon as a worker is free (a new run, a spec change, a finished RayJob)."""
        key = (namespace, name)
        with self._cond:
            # Two requests pending for one run: the body of the first may be stale, so read it fresh.
            self._urgent[key] = None if key in self._urgent else body
            self._cond.notify()

    def track(self, namespace: str, name: str, *, finished: bool) -> None:
        """A run seen on the watch: refresh it within one interval, unless it is finished (nothing
        left to read or write: ``reconcile.settled``)."""
        key = (namespace, name)
        with self._cond:
            if finished:
                self._tracked.pop(key, None)
            elif key not in self._tracked:
                # Spread over the interval: runs created in one burst are not refreshed in one wave.
                self._schedule(key, _Tracked(0.0), self.interval_s() * self._rng.uniform(0.5, 1.0), timer=False)

    def forget(self, namespace: str, name: str) -> None:
        with self._cond:
            self._tracked.pop((namespace, name), None)

    def active(self) -> int:
        with self._cond:
            return len(self._tracked)

    def backlog(self) -> int:
        """Urgent requests waiting for a worker or being reconciled: more than the caller's own one
        means a burst of new runs is under way (whether they queue depends on how fast kopf hands
        them over, so the ones in progress count too)."""
        with self._cond:
            return len(self._urgent) + self._urgent_running

    def interval_s(self) -> float:
        """Seconds between two refreshes of one run: the configured interval, longer with many runs."""
        return max(self._interval_s, len(self._tracked) / self._rate)

    # ------------------------------------------------------------------ the workers

    def _schedule(self, key: Key, entry: _Tracked, delay_s: float, *, timer: bool) -> None:
        entry.due, entry.timer = time.monotonic() + delay_s, timer
        self._tracked[key] = entry
        heapq.heappush(self._timers if timer else self._refreshes, (entry.due, key))

    def _take_token(self, now: float) -> bool:
        self._tokens = min(max(1.0, self._rate), self._tokens + (now - self._tokens_at) * self._rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _next(self) -> tuple[Key, Body, str] | None:
        """(key, body, REQUEST | TIMER | REFRESH) of the next reconcile, or None; called with the lock held."""
        for key in self._urgent:
            if key not in self._busy:
                return key, self._urgent.pop(key), REQUEST
        now = time.monotonic()
        timer = self._pop_due(self._timers, now, timer=True)
        if timer is not None:
            return timer, None, TIMER
        # While new runs wait, their API calls go first: refreshes pause (timers do not).
        if self._urgent or self._refreshing >= self._refresh_workers:
            return None
        refresh = self._pop_due(self._refreshes, now, timer=False)
        return (refresh, None, REFRESH) if refresh is not None else None

    def _pop_due(self, heap: list[tuple[float, Key]], now: float, *, timer: bool) -> Key | None:
        """The first run due in ``heap`` (a refresh only if the rate allows one now), or None."""
        while heap and heap[0][0] <= now:
            due, key = heap[0]
            entry = self._tracked.get(key)
            if entry is None or entry.due != due or entry.timer != timer:
                heapq.heappop(heap)  # forgotten or rescheduled since
                continue
            if key in self._busy:
                heapq.heappop(heap)  # being reconciled now; rescheduled when that ends
                entry.due = float("inf")
                continue
            if not timer and not self._take_token(now):
                return None
            heapq.heappop(heap)
            entry.due = float("inf")  # taken: not due again until rescheduled
            return key
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._next()
                while item is None and not self._stopping:
                    self._cond.wait(self._tick_s)
                    item = self._next()
                if item is None or self._stopping:
                    return
                key, body, kind = item
                self._busy.add(key)
                self._refreshing += kind == REFRESH
                self._urgent_running += kind == REQUEST
                if kind == REFRESH:
                    metrics.REFRESHES.inc()
            delay: float | None = None
            failed = False
            try:
                delay = self._reconcile(key[0], key[1], body)
            except Exception:  # one run's bad moment must not stop the queue for the others
                log.exception("reconcile of %s/%s failed", *key)
                failed = True
            with self._cond:
                self._busy.discard(key)
                self._refreshing -= kind == REFRESH
                self._urgent_running -= kind == REQUEST
                self._after(key, delay, failed=failed)
                self._cond.notify_all()

    def _after(self, key: Key, delay: float | None, *, failed: bool) -> None:
        entry = self._tracked.get(key)
        if entry is None:
            return
        interval = self.interval_s()
        if failed:
            entry.failures += 1
            retry = min(interval, FIRST_RETRY_S * 2 ** (entry.failures - 1))
            log.info("trying %s/%s again in %.0f s", *key, retry)
            self._schedule(key, entry, retry, timer=True)
            return
        entry.failures = 0
        if delay is not None and delay < interval:
            self._schedule(key, entry, max(delay, 0.0), timer=True)
        else:
            self._schedule(key, entry, interval * self._rng.uniform(1 - JITTER, 1 + JITTER), timer=False)
