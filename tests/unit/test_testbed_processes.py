"""The test bed's processes live as long as the process that started them, not the thread.

PR_SET_PDEATHSIG, which kills them when the test process dies, fires when the *thread* that forked
them ends: the nemesis campaign once lost an API server it had restarted from a fault's thread, and a
benchmark's reclaimer thread started a new spot node that died with it. ``popen_dying_with_us``
forks from one thread that lives as long as the process, whichever thread asks.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

import testbed.cluster as tb

pytestmark = pytest.mark.unit


def started_from_a_thread_that_ends(start: object) -> subprocess.Popen[bytes]:
    """The process ``start(argv)`` returns, called from a thread that has ended by the time this returns."""
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(start(["sleep", "60"])))  # type: ignore[operator]
    thread.start()
    thread.join()
    return started[0]


def test_a_process_started_from_a_short_lived_thread_outlives_the_thread() -> None:
    child = started_from_a_thread_that_ends(tb.popen_dying_with_us)
    try:
        time.sleep(0.5)  # the parent-death signal, were it sent, has arrived by now
        assert child.poll() is None, f"the child died with the thread that asked for it: {child.returncode}"
    finally:
        child.kill()
        child.wait()


def test_the_death_signal_still_follows_the_forking_thread_this_guards_against() -> None:
    """The kernel behaviour itself: forked from the short-lived thread, the child dies with it."""
    child = started_from_a_thread_that_ends(
        lambda argv: subprocess.Popen(argv, preexec_fn=tb._die_with_parent)  # noqa: PLW1509 - only prctl
    )
    assert child.wait(timeout=10) == -9
