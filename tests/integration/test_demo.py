"""`make demo` end to end, shortened: the kill, the resume, the summary and the PNG."""

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_kills_resumes_and_plots(tmp_path: Path) -> None:
    output = tmp_path / "demo"
    command = [
        sys.executable, "-m", "jobs.gpt2.demo",
        "--max-steps", "30", "--save-steps", "10", "--kill-at", "16", "--output", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resumed from step     10" in result.stdout
    assert "finished at step      30/30" in result.stdout
    with Image.open(output / "loss.png") as image:
        assert image.format == "PNG"
        assert image.width > 500
        assert image.height > 300
