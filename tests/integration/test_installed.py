"""spotray as a user installs it: the console script, and the message a missing extra gives.

Marker `core`: `make test-compat` runs these in venvs that hold only `pip install spotray` (the
wheel), where the extras are really missing. In the development venv every extra is installed, so
the missing-extra cases are skipped there with a reason.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.core]

BIN = Path(sys.executable).parent


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_the_console_script_prints_its_help(tmp_path: Path) -> None:
    result = run([str(BIN / "spotray"), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("run", "submit", "status", "watch", "logs", "pull", "plot", "checkpoints"):
        assert command in result.stdout


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here (the [ray] extra)")
def test_importing_the_launcher_without_ray_names_the_extra(tmp_path: Path) -> None:
    result = run([sys.executable, "-c", "import spotray.train.launch.launcher"], tmp_path)
    assert result.returncode == 1
    assert "MissingExtraError" in result.stderr
    assert "pip install 'spotray[ray]'" in result.stderr, result.stderr


@pytest.mark.skipif(importlib.util.find_spec("kubernetes") is not None, reason="the [controller] extra is installed")
def test_a_cluster_command_without_the_kubernetes_client_names_the_extra(tmp_path: Path) -> None:
    result = run([str(BIN / "spotray"), "status", "some-run"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'spotray[controller]'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("kopf") is not None, reason="the [controller] extra is installed")
def test_the_controller_without_kopf_names_the_extra(tmp_path: Path) -> None:
    result = run([sys.executable, "-m", "spotray.controller"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'spotray[controller]'" in result.stderr, result.stderr
