"""Kubernetes Events on TrainingRuns, posted from a background thread and never twice in a row.

Events are for people (`kubectl describe trainingrun`): posting one must not slow a reconcile, and
a condition that holds for an hour (a Secret still missing, storage still unreachable) must not
write one Event per reconcile. The same event (type, reason, message) on the same run is posted
again only after ``repeat_after_s``; the memory of what was posted is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from spotray.decisions.vocabulary import Event

Post = Callable[[dict[str, Any], Event, datetime], None]
REPEAT_AFTER_S = 600.0
REMEMBERED = 10_000


class EventPoster:
    """Posts each event once per ``repeat_after_s`` per run, on one background thread."""

    def __init__(self, repeat_after_s: float = REPEAT_AFTER_S, remembered: int = REMEMBERED) -> None:
        self._repeat_after_s = repeat_after_s
        self._remembered = remembered
        self._posted: OrderedDict[tuple[str, str, str, str], float] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotray-events")
        self.skipped = 0

    def _is_new(self, run: dict[str, Any], event: Event) -> bool:
        key = (run["metadata"]["uid"], event.type, event.reason, event.message)
        now = time.monotonic()
        with self._lock:
            last = self._posted.get(key)
            if last is not None and now - last < self._repeat_after_s:
                self.skipped += 1
                return False
            self._posted[key] = now
            self._posted.move_to_end(key)
            while len(self._posted) > self._remembered:
                self._posted.popitem(last=False)
            return True

    def post(self, post: Post, run: dict[str, Any], event: Event, now: datetime) -> bool:
        """Queue ``post(run, event, now)`` unless the same event was posted on this run lately."""
        if not self._is_new(run, event):
            return False
        self._pool.submit(post, run, event, now)
        return True

    def drain(self) -> None:
        """Wait for the events queued so far (tests)."""
        self._pool.submit(lambda: None).result()
