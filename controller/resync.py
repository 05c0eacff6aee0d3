"""The periodic look at every active TrainingRun: progress and checkpoints from S3, backoffs that ran out.

kopf's own timers would do this, but a kopf timer puts a finalizer on every object: each new run
then waits for an extra write and watch round trip before its first handler (measured: about 0.4 s
of the create-to-RayJob time under a burst, bench/controller.py), and deleting a run hangs
whenever the controller is down. This loop needs neither. It runs on its own small thread pool,
so slow S3 reads never delay the handlers that create RayJobs. Runs become known through kopf's
watch (``track``) and are forgotten when deleted or finished.

With kopf peering (HA, several replicas) the handlers use kopf's timer instead, which kopf pauses
on the standby replicas (controller/handlers.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from spotray.train.api_names import TERMINAL_PHASES

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class Resync:
    """Calls ``reconcile(namespace, name)`` for each active run every ``interval_s`` (or sooner when asked)."""

    def __init__(
        self, reconcile: Callable[[str, str], float | None], interval_s: float, workers: int = 4, tick_s: float = 0.5
    ) -> None:
        self._reconcile = reconcile
        self._interval_s = interval_s
        self._tick_s = tick_s
        self._due: dict[Key, float] = {}  # when each active run is next looked at
        self._running: set[Key] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spotray-resync")
        self._thread = threading.Thread(target=self._loop, name="spotray-resync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def track(self, namespace: str, name: str, phase: str | None) -> None:
        """A run seen on the watch: look at it within one interval, unless it is finished."""
        key = (namespace, name)
        with self._lock:
            if phase in TERMINAL_PHASES:
                self._due.pop(key, None)
            else:
                self._due.setdefault(key, time.monotonic() + self._interval_s)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._due.pop((namespace, name), None)

    def active(self) -> int:
        with self._lock:
            return len(self._due)

    def _loop(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                ready = [key for key, due in self._due.items() if due <= now and key not in self._running]
                self._running.update(ready)
            for key in ready:
                self._pool.submit(self._one, key)

    def _one(self, key: Key) -> None:
        delay: float | None = None
        try:
            delay = self._reconcile(*key)
        except Exception:  # a bad moment for one run must not stop the loop for the others
            log.exception("periodic reconcile of %s/%s failed; trying again in %.0f s", *key, self._interval_s)
        with self._lock:
            self._running.discard(key)
            if key in self._due:
                wait = self._interval_s if delay is None else min(max(delay, self._tick_s), self._interval_s)
                self._due[key] = time.monotonic() + wait
