"""Every benchmark imports: a name moved in the package fails here, not months later when someone
runs `make bench` (bench/micro/recovery.py and streaming.py imported helpers that had moved to
spotray/train/storage/mds_dataset.py, found only when bench/ became subpackages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_module_imports() -> None:
    names = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "bench").rglob("*.py")
        if path.name != "__init__.py"
    )
    assert "bench.campaigns.nemesis" in names
    code = (
        "import importlib, json, sys\n"
        "failed = {}\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failed[name] = f'{type(error).__name__}: {error}'\n"
        "print(json.dumps(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}
