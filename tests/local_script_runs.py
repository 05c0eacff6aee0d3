"""A TrainingRun whose entrypoint is a small Python driver of the test's own, run by `spotray run --local`:
for the tests of what local mode does around an attempt (its Ray cluster, its watch), not of training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def run_driver_script(tmp_path: Path, name: str, driver: str, *, timeout_s: float) -> tuple[str, Path, int]:
    """Run ``driver`` (Python source) as the run's entrypoint; (its output, the work directory, exit code).

    Raises subprocess.TimeoutExpired when the run outlasts ``timeout_s``."""
    script = tmp_path / "driver.py"
    script.write_text(driver)
    manifest = {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": f"python {script}",
            "workers": {"replicas": 1, "cpu": "1", "memory": "1Gi", "gpu": 0},
            "checkpoint": {"uri": f"file://{tmp_path / 'checkpoints'}"},
            "retry": {"backoffSeconds": 1},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    workdir = tmp_path / "wd"
    command = [sys.executable, "-m", "spotray.cli", "run", str(path), "--local", "--workdir", str(workdir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    return result.stdout + result.stderr, workdir, result.returncode
