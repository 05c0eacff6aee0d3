"""spotray as a user installs it: the console script, the light core, and the message a missing extra gives.

Marker `light`: `make test-compat`'s light entry runs these in a venv that holds only `pip install
spotray` (the wheel, no extra): no torch, no Ray, no kopf. Marker `core`: its other entries run
them in venvs with `spotray[train]` (no Ray, no kopf). In the development venv every extra is
installed, so the cases about a missing one are skipped there with a reason, and the rest run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
WITHOUT_TORCH = pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None, reason="torch is installed here (the [train] extra)"
)


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env=environment)


@pytest.mark.light
@pytest.mark.core
def test_the_console_script_prints_its_help(tmp_path: Path) -> None:
    result = run([str(BIN / "spotray"), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("run", "submit", "status", "watch", "logs", "pull", "plot", "checkpoints"):
        assert command in result.stdout


@pytest.mark.light
def test_the_console_script_and_the_package_say_the_installed_version(tmp_path: Path) -> None:
    installed = importlib.metadata.version("spotray")
    result = run([str(BIN / "spotray"), "--version"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"spotray {installed}"
    result = run([sys.executable, "-c", "import spotray; print(spotray.__version__)"], tmp_path)
    assert result.stdout.strip() == installed, result.stderr


@pytest.mark.light
def test_the_light_core_imports_no_torch_ray_or_kopf(tmp_path: Path) -> None:
    """What `pip install spotray` is for: the CLI's commands, the contract and the store, without torch."""
    code = (
        "import sys\n"
        "import spotray, spotray.cli.main, spotray.cli.cluster_client, spotray.contract.spec\n"
        "from spotray import open_store, ObjectStore\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'kopf') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.light
def test_status_without_a_cluster_says_what_to_fix_and_no_traceback(tmp_path: Path) -> None:
    result = run([str(BIN / "spotray"), "status", "some-run"], tmp_path, KUBECONFIG=str(tmp_path / "no-such-config"))
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert "KUBECONFIG" in result.stderr, result.stderr  # the fix names what to set


@pytest.mark.light
@WITHOUT_TORCH
def test_the_light_core_has_no_torch_and_the_training_names_say_which_extra(tmp_path: Path) -> None:
    assert importlib.util.find_spec("transformers") is None
    result = run([sys.executable, "-c", "from spotray import S3CheckpointCallback"], tmp_path)
    assert result.returncode == 1
    assert "MissingExtraError" in result.stderr
    assert "pip install 'spotray[train]'" in result.stderr, result.stderr


@pytest.mark.light
@WITHOUT_TORCH
def test_a_local_run_without_the_ray_extra_names_it_and_no_traceback(tmp_path: Path) -> None:
    manifest = ROOT / "jobs" / "gpt2" / "trainingrun.yaml"
    result = run([str(BIN / "spotray"), "run", str(manifest), "--local"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'spotray[ray]'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.core
def test_the_training_names_import_without_ray(tmp_path: Path) -> None:
    """A Trainer script outside Ray needs [train] only: the callback and the notice handler load no Ray."""
    code = (
        "import sys\n"
        "from spotray import S3CheckpointCallback, PreemptionNoticeCallback, fetch_resume_checkpoint\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.core
@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here (the [ray] extra)")
def test_importing_the_launcher_without_ray_names_the_extra(tmp_path: Path) -> None:
    result = run([sys.executable, "-c", "import spotray.train.launch.launcher"], tmp_path)
    assert result.returncode == 1
    assert "MissingExtraError" in result.stderr
    assert "pip install 'spotray[ray]'" in result.stderr, result.stderr


@pytest.mark.core
@pytest.mark.skipif(importlib.util.find_spec("kopf") is not None, reason="the [controller] extra is installed")
def test_the_controller_without_kopf_names_the_extra(tmp_path: Path) -> None:
    result = run([sys.executable, "-m", "spotray.controller"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'spotray[controller]'" in result.stderr, result.stderr
