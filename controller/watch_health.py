"""Is the TrainingRun watch still delivering? /healthz fails when it is not, so the pod is restarted.

kopf restarts a watch that errors or times out, but a watch task that is stuck or dead for any
other reason leaves the process up, /healthz green and every new run ignored. The only way to know
is to compare: now and then the checker LISTs the runs (one request) and compares each run's
``resourceVersion`` with the newest one the watch handed to the handlers. A run whose listed
version the watch has not delivered, and for which no event at all came in ``grace_s`` seconds
since that LIST, means the watch is behind: the probe then fails with the names of those runs.

A LIST that fails says nothing about the watch (the API server may be down; restarting the
controller would not help), so it leaves the verdict as it was. Under kopf peering the standby
replicas' watches are paused on purpose: the check runs only in standalone mode (the resync loop's
mode too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class WatchHealth:
    """What the watch delivered, compared with what a LIST shows (pure: times are passed in)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._seen: dict[Key, tuple[str, float]] = {}  # newest resourceVersion delivered, and when
        self._waiting: dict[Key, float] = {}  # listed with a version not delivered yet: since when
        self._lock = threading.Lock()
        self.problem: str | None = None

    def saw(self, key: Key, resource_version: str, now: float) -> None:
        """The watch delivered ``key`` at ``resource_version``."""
        with self._lock:
            self._seen[key] = (resource_version, now)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._seen.pop(key, None)
            self._waiting.pop(key, None)

    def compare(self, listed: dict[Key, str], now: float) -> str | None:
        """Compare with a LIST made at ``now``; returns (and keeps) the problem, or None when healthy."""
        with self._lock:
            for key in list(self._waiting):
                if key not in listed:
                    del self._waiting[key]  # deleted since: nothing to deliver
            late: list[Key] = []
            for key, version in listed.items():
                seen = self._seen.get(key)
                if seen is not None and seen[0] == version:
                    self._waiting.pop(key, None)
                    continue
                since = self._waiting.get(key)
                if since is None or (seen is not None and seen[1] >= since):
                    self._waiting[key] = now  # new, or the watch moved on for it since: wait again
                elif now - since >= self.grace_s:
                    late.append(key)
            self.problem = None
            if late:
                names = ", ".join(f"{namespace}/{name}" for namespace, name in sorted(late)[:5])
                self.problem = (
                    f"the TrainingRun watch is stalled: {len(late)} run(s) changed in the API server "
                    f"and no event came for {self.grace_s:.0f} s ({names})"
                )
            return self.problem


class WatchChecker:
    """A thread that LISTs the runs every ``interval_s`` and compares (``WatchHealth.compare``)."""

    def __init__(self, health: WatchHealth, list_runs: Callable[[], dict[Key, str]], interval_s: float) -> None:
        self.health = health
        self._list_runs = list_runs
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spotray-watch-check", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check_once(self) -> None:
        try:
            listed = self._list_runs()
        except Exception as error:  # noqa: BLE001 - an unreadable list is no verdict (see the module docstring)
            log.warning("could not list TrainingRuns to check the watch (%s); trying again", error)
            return
        was = self.health.problem
        problem = self.health.compare(listed, time.monotonic())
        if problem and problem != was:
            log.error("%s; /healthz now fails so that the controller is restarted", problem)
        elif was and not problem:
            log.info("the TrainingRun watch caught up; /healthz is green again")

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check_once()
