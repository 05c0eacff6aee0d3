"""The test bed's Ray head stops every process it started, even one nothing else names.

A `ray start` that failed while starting can leave an agent behind that carries neither the test
bed's marker (Ray's agents rewrite their environment) nor an open file in the head's temp dir
(its raylet died before the agent opened its logs), and stop() only sent SIGTERM to the process
group when `ray start` itself was already gone; the nemesis campaign found such agents running on
after failed starts, the load growing with each. They are still in `ray start`'s session.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import testbed.cluster as tb
from spotray.train.processes.subprocesses import is_running, start_time

pytestmark = pytest.mark.unit


def test_stop_ends_a_process_left_in_ray_starts_session(tmp_path: Path) -> None:
    # The "ray start": a shell, its own session leader, that leaves an unmarked orphan and exits.
    # The orphan ignores SIGTERM, as a busy agent can for longer than stop() waits: stop()'s
    # SIGTERM to the process group is not enough.
    env = {key: value for key, value in os.environ.items() if key != tb.MARKER}
    orphan_pid_file = tmp_path / "orphan.pid"
    head = tb.RayHead(tmp_path, address="127.0.0.9", marker="test-marker")
    head.proc = subprocess.Popen(
        ["sh", "-c", f"(trap '' TERM; exec sleep 300) & echo $! > {orphan_pid_file}"], env=env, start_new_session=True
    )
    head.session = (head.proc.pid, start_time(head.proc.pid))
    head.proc.wait(timeout=10)
    orphan = int(orphan_pid_file.read_text())
    try:
        assert is_running(orphan)
        assert orphan not in tb.marked_processes("test-marker")
        head.stop()
        deadline = time.monotonic() + 10
        while is_running(orphan) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_running(orphan), "the orphan in ray start's session outlived stop()"
    finally:
        tb.kill_pids([orphan])


def test_a_session_whose_leader_pid_names_another_process_is_left_alone(tmp_path: Path) -> None:
    head = tb.RayHead(tmp_path, address="127.0.0.9", marker="test-marker")
    head.session = (os.getpid(), -1)  # as if our pid had been reused
    assert head._session_processes() == []
