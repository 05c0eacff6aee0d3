"""The driver's own SIGTERM: a spot notice for the whole Ray cluster, with a bound on what follows.

The driver drains every live node as preempted (train/launch/ray_drain.py); Ray Train tells the
workers, which take an emergency checkpoint and stop, and ``fit()`` returns. Once every node is
drained, no worker group Ray Train starts can ever run there: a fixed-size run lets Ray Train start
none (``max_preemption_failures=0``, train/launch/launcher.py), but an elastic group's restart after
the drain deadline waits for room for ever. So the driver gives ``fit()`` the deadline and
``margin_s`` more, then ends the attempt itself (``on_overdue``): a preemption, whose record says
whether its emergency checkpoint was complete. Every wait has a bound; this is the driver's.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from spotray.contract.names import DRIVER_EXIT_MARGIN_S

log = logging.getLogger(__name__)

# How long past the drain deadline the driver waits for fit() to end after its own SIGTERM. Ray
# Train tears a group down as the deadline passes and fit() ends within seconds; past this it never will.
EXIT_MARGIN_S = float(DRIVER_EXIT_MARGIN_S)


class DriverNotice:
    """Installed once per attempt (``install``); ``fit_ended`` is called when ``fit()`` returned or raised.

    ``drain(reason, grace_seconds)`` drains every node and returns how many accepted;
    ``on_overdue(waited_s)`` ends the attempt when ``fit()`` has not ended in time (it exits the process).
    """

    def __init__(
        self,
        grace_seconds: int,
        drain: Callable[[str, int], int],
        on_overdue: Callable[[float], None],
        margin_s: float = EXIT_MARGIN_S,
    ) -> None:
        self.grace_seconds, self.margin_s = grace_seconds, margin_s
        self._drain, self._on_overdue = drain, on_overdue
        self._received_at: float | None = None
        self._ended = threading.Event()
        # Held while the attempt is ended here, so fit() ending at that moment waits instead of racing it.
        self._ending = threading.Lock()

    @property
    def received(self) -> bool:
        """Whether the driver got its SIGTERM: every node was drained, so the attempt ends as a preemption."""
        return self._received_at is not None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        first = self._received_at is None
        if first:
            self._received_at = time.monotonic()
        log.warning("SIGTERM: asking the workers for an emergency checkpoint within %d s", self.grace_seconds)
        drained = self._drain("spotray: SIGTERM received by the driver", self.grace_seconds)
        log.warning("%d node(s) draining", drained)
        if first:
            threading.Thread(target=self._bound, name="spotray-notice-bound", daemon=True).start()

    def fit_ended(self) -> None:
        with self._ending:
            self._ended.set()

    def _bound(self) -> None:
        if self._ended.wait(self.grace_seconds + self.margin_s):
            return
        with self._ending:
            if self._ended.is_set():
                return
            assert self._received_at is not None
            waited = time.monotonic() - self._received_at
            log.error(
                "fit() has not ended %.0f s after the driver's SIGTERM drained every node (a deadline of %d s): "
                "ending the attempt as a preemption",
                waited,
                self.grace_seconds,
            )
            self._on_overdue(waited)


def stop_without_drain() -> None:
    """The driver's SIGTERM on a Ray cluster that outlives its attempt (a run's kept cluster, the
    chart's long-lived one): the job is being stopped (its RayJob deleted, the run suspended, `ray job
    stop`), and the nodes stay, for the run's next attempt or for other runs. ``DriverNotice`` would
    drain them all, and Ray never schedules on a drained node again. So this drains nothing and ends
    the process as the signal would; the next attempt resumes from the newest complete checkpoint (a
    notice that takes a node reaches its pod's preStop hook, which drains that node alone)."""

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        log.warning(
            "SIGTERM: the job is stopped on a Ray cluster that outlives this attempt; it drains no node "
            "(the cluster stays usable) and ends now"
        )
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
