"""The cluster demo's smoke (the run itself is tests/e2e/test_cluster_demo.py, minutes long)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spotray.contract.spec import parse_training_run
from testbed import cluster_demo

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_run_is_a_valid_training_run_that_uses_the_demo_secret(tmp_path: Path) -> None:
    document = cluster_demo.demo_training_run(tmp_path / "job")
    run = parse_training_run(document)
    assert run.spec.checkpoint.secret_ref == cluster_demo.SECRET
    assert run.spec.workers.replicas == 1
    assert cluster_demo.PREEMPT_AT_STEP % cluster_demo.CHECKPOINT_EVERY != 0, "the node goes between checkpoints"
    assert cluster_demo.PREEMPT_AT_STEP < cluster_demo.MAX_STEPS


def test_the_demo_explains_itself() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "testbed.cluster_demo", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--keep" in result.stdout
