"""An elastic run's resource view follows node changes at once (train/launch/node_watch.py)."""

import time
from typing import Any

import pytest

from spotray.train.launch.node_watch import NodeWatch

pytestmark = pytest.mark.unit


def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_node_that_dies_or_joins_refreshes_the_view_once_and_errors_do_not_end_the_watch() -> None:
    tables: list[Any] = [
        [{"NodeID": "head", "Alive": True}, {"NodeID": "spot", "Alive": True}],
        [{"NodeID": "head", "Alive": True}, {"NodeID": "spot", "Alive": True}],
        [{"NodeID": "head", "Alive": True}, {"NodeID": "spot", "Alive": False}],  # the spot node died
        RuntimeError("GCS unavailable"),
        [{"NodeID": "head", "Alive": True}, {"NodeID": "spot", "Alive": False}],
        [{"NodeID": "head", "Alive": True}, {"NodeID": "spot", "Alive": False}, {"NodeID": "new", "Alive": True}],
    ]
    seen: list[Any] = []

    def nodes() -> list[dict[str, Any]]:
        table = tables.pop(0) if len(tables) > 1 else tables[0]
        seen.append(table)
        if isinstance(table, Exception):
            raise table
        return table

    refreshed: list[int] = []
    watch = NodeWatch(lambda: refreshed.append(len(seen)), nodes=nodes, poll_s=0.001).start()
    try:
        wait_for(lambda: len(seen) >= 8)
    finally:
        watch.stop()
    assert refreshed == [3, 6], "once when the spot node died, once when a node joined; never for nothing"
    assert watch.errors == 1
