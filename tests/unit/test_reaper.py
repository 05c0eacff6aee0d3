"""The watchdog's kill step (spotray/local/reaper.py) on real processes: a session's members, never a reused pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotray.local.reaper import Reaper, reap
from spotray.train.hf.streaming_memory import SHM_DIR
from spotray.train.processes.subprocesses import session_members, start_time

pytestmark = pytest.mark.unit

# A session leader with a child of its own, like `ray start` with gcs_server and raylet.
FAMILY = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"


def spawn_session() -> subprocess.Popen[bytes]:
    leader = subprocess.Popen([sys.executable, "-c", FAMILY], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(session_members(leader.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(session_members(leader.pid)) == 2
    return leader


def test_every_member_of_a_registered_session_is_killed() -> None:
    leader = spawn_session()
    killed = reap({leader.pid: start_time(leader.pid) or 0})
    assert len(killed) == 2
    leader.wait(timeout=5)
    deadline = time.monotonic() + 5
    while session_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_members(leader.pid) == []


def test_a_session_whose_leader_pid_now_names_another_process_is_left_alone() -> None:
    leader = spawn_session()
    try:
        assert reap({leader.pid: (start_time(leader.pid) or 0) - 1}) == []
        assert len(session_members(leader.pid)) == 2
    finally:
        reap({leader.pid: start_time(leader.pid) or 0})
        leader.wait(timeout=5)


def test_the_watchdog_kills_what_its_owner_left_when_the_pipe_closes() -> None:
    leader = spawn_session()
    with Reaper() as reaper:
        reaper.watch_session(leader.pid)
    # The owner "ended" without stopping the session: closing the pipe is all the watchdog needs.
    leader.wait(timeout=10)
    deadline = time.monotonic() + 5
    while session_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_members(leader.pid) == []


def test_the_watchdog_releases_the_announced_dataset_caches_shared_memory(tmp_path: Path) -> None:
    """A run's Ray workers are killed at its end, so streaming never unlinks its segments itself."""
    cache = tmp_path / "job dir" / "mds-cache"  # a space in the path survives the pipe
    prefix = 900_000 + os.getpid() % 99_999  # far above any prefix streaming hands out (it counts up from 0)
    segment = SHM_DIR / f"{prefix:06}_locals"
    data = f"{cache}\0{prefix}".encode()
    segment.write_bytes((4 + len(data)).to_bytes(4, sys.byteorder) + data)
    try:
        with Reaper() as reaper:
            reaper.release_dataset_cache(str(cache))
        assert not segment.exists()
    finally:
        segment.unlink(missing_ok=True)
