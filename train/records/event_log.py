"""A small JSON-lines event log: what a training process did, for people and for tools.

Each line is one JSON object with ``event`` and ``time``. It is a local file (``SPOTRAY_EVENTS``):
local mode (spotray/local/local_run.py) follows it while an attempt runs (progress, faults injected at a
step) and reads it back for the goodput ledger and the loss plot; the benchmarks and tests read it
too. The controller and ``spotray watch`` never see it: they follow the progress objects in the
store (train/records/progress_log.py). Writing is thread-safe because the background uploader
reports from its own thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_ENV = "SPOTRAY_EVENTS"  # the event log's path, which local mode sets for an attempt's processes


class EventLog:
    """Append events to a file (or nowhere when ``path`` is None), one JSON object per line."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "time": time.time(), **fields}, sort_keys=True)
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()


def event_log_from_env() -> EventLog:
    """The event log local mode asked for (``SPOTRAY_EVENTS``), else one that writes nowhere."""
    path = os.environ.get(EVENTS_ENV)
    return EventLog(Path(path) if path else None)


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Events from ``path``; a last line cut off by a kill is ignored."""
    if not path.exists():
        return
    with path.open() as handle:
        for line in handle:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
