"""make test's load summary (hack/machine_load.py): it samples until SIGTERM, then says what it saw."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "machine_load.py"


def test_stopped_by_sigterm_it_prints_one_summary_and_leaves_its_samples(tmp_path: Path) -> None:
    log = tmp_path / "load.log"
    sampler = subprocess.Popen([sys.executable, str(SCRIPT), str(log)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    sampler.send_signal(signal.SIGTERM)
    out, _ = sampler.communicate(timeout=20)
    assert sampler.returncode == 0
    assert out.startswith("machine load over "), out
    assert "least memory available" in out, out
    assert "least disk free" in out, out
    first_sample = log.read_text().splitlines()[0]
    assert " load " in first_sample, first_sample
    assert " mem_available " in first_sample, first_sample
