"""An elastic run's view of the cluster follows nodes leaving and joining within a second.

Ray Train's elastic scaling policy sizes a new worker group from the reservations of Ray Data's
AutoscalingCoordinator, which re-reads the cluster's nodes every 20 s (its ``TICK_INTERVAL_S``).
So a worker group restarted right after a node left was sized for the node that was gone: Ray
Train asked for the old size, waited out its worker group start timeout (30 s for elastic runs,
train/launch/launcher.py), and only then asked for fewer. Measured in local mode with a spot
notice (tests/integration/test_elastic.py): 62 s from the node's SIGTERM to the smaller group.

The driver of an elastic run therefore watches the GCS's node table (``ray.nodes()``, twice a
second) and, when a node dies or joins, asks the coordinator for a fresh view at once
(``get_reserved_resources(recompute=True)``, the call Ray's own callers use before pinning work to
nodes). A Ray without that call is left as it was, with one warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from spotray.contract.extras import extra_required
from spotray.train.launch.ray_drain import alive_nodes

with extra_required("ray"):
    import ray

log = logging.getLogger(__name__)

POLL_S = 0.5  # Ray Train restarts a group within about a second of a worker's death
REFRESH_TIMEOUT_S = 10.0
REQUESTER = "spotray-node-watch"  # the coordinator answers an unknown requester with nothing, after its tick


def coordinator_refresh(coordinator: Any) -> Callable[[], None]:
    """A call that makes the AutoscalingCoordinator (its actor handle) re-read the cluster now, and waits for it."""

    def refresh() -> None:
        ray.get(coordinator.get_reserved_resources.remote(REQUESTER, recompute=True), timeout=REFRESH_TIMEOUT_S)

    return refresh


class NodeWatch:
    """A daemon thread: on every change in the live nodes, ``refresh()``. Errors are logged once and
    the watch goes on (a GCS blip passes); it only speeds up what the coordinator does every 20 s anyway."""

    def __init__(
        self,
        refresh: Callable[[], None],
        nodes: Callable[[], list[dict[str, Any]]] = ray.nodes,
        poll_s: float = POLL_S,
    ) -> None:
        self.refresh = refresh
        self.nodes = nodes
        self.poll_s = poll_s
        self.refreshes = 0
        self.errors = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="spotray-node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        alive: frozenset[str] | None = None
        while not self.stopped.is_set():
            try:
                now = alive_nodes(self.nodes())
                if alive is not None and now != alive:
                    self.refresh()
                    self.refreshes += 1
                    log.info("Ray nodes changed (%d gone, %d new): resource view refreshed", *_changes(alive, now))
                alive = now
            except Exception as error:  # noqa: BLE001 - a speed-up only: the coordinator still ticks every 20 s
                self.errors += 1
                if self.errors == 1:
                    log.warning("watching Ray's nodes failed (%s); Ray Train sees node changes within 20 s", error)
            self.stopped.wait(self.poll_s)


def _changes(before: frozenset[str], after: frozenset[str]) -> tuple[int, int]:
    return len(before - after), len(after - before)
