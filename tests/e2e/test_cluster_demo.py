"""`make cluster-demo` end to end (hack/cluster_demo.py): minutes, so in make test-e2e / test-campaign;
make test keeps the smoke in tests/unit/test_cluster_demo.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.campaign]

ROOT = Path(__file__).resolve().parents[2]


def test_the_cluster_demo_loses_a_spot_node_resumes_and_leaves_a_model_and_a_plot(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "cluster_demo.py"), "--dir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "attempt 1: Preempted (NodeLost)" in output, output[-6000:]
    assert "attempt 2: Succeeded (TrainingFinished)" in output, output[-6000:]
    assert (workdir / "model" / "model.safetensors").exists()
    assert (workdir / "loss.png").stat().st_size > 0
    assert not (workdir / "supervisor.pid").exists(), "the demo stopped what it started"
