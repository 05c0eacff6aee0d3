"""`make cluster-demo KEEP=1` then `make cluster-down`, end to end (testbed/cluster_demo.py): minutes, so
in make test-e2e / test-campaign; make test keeps the smoke in tests/unit/test_cluster_demo.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.campaign]

ROOT = Path(__file__).resolve().parents[2]
KEPT_UP = "kept up:"


def test_the_cluster_demo_loses_a_spot_node_resumes_and_cluster_down_stops_it_all(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A short directory: the nodes' containerd sockets live in it, and a Unix socket's path has at
    # most 104 bytes to containerd (tmp_path, named after this test, took the ttrpc socket's past it).
    tmp_path = tmp_path_factory.mktemp("demo")
    workdir = tmp_path / "demo"
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "testbed.cluster_demo", "--dir", str(workdir), "--keep"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 1500
        while KEPT_UP not in log_path.read_text() and demo.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
        output = log_path.read_text()
        assert KEPT_UP in output, output[-6000:]
        assert "attempt 1: Preempted" in output
        assert "attempt 2: Succeeded (TrainingFinished)" in output
        assert (workdir / "model" / "model.safetensors").exists()
        assert (workdir / "loss.png").stat().st_size > 0

        down = subprocess.run(
            [sys.executable, "-m", "testbed.cluster", "down", "--dir", str(workdir)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert demo.wait(timeout=60) == 130, "stopped by make cluster-down"
        assert not (workdir / "supervisor.pid").exists()
        leftovers = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True, check=False)
        assert leftovers.stdout.split() == [], "a process of the demo outlived cluster-down"
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(timeout=60)
