"""`spotray run SWEEP --local` end to end (issue 40): successive halving that suspends and promotes.

A grid of six learning rates, one trial at a time, each trial 30 paced steps with one rung at step
10. Early in training a higher learning rate has the lower loss, so the trials reach the rung in an
order whose outcome is known: trial 1 (the highest rate) goes on; trial 2, second at the rung, is
stopped there (of two, only the best goes on); trials 3 to 6 are stopped too, and once six trials
have reached the rung the best third is two trials, so trial 2 is promoted: it resumes from its
newest complete checkpoint and finishes (one of the two that finish is the best). Its final weights
must equal those of the same trial run alone, uninterrupted: a trial stopped and resumed loses nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
LEARNING_RATES = [0.03, 0.01, 0.003, 0.001, 0.0003, 0.0001]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sweep_document(tmp_path: Path) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "jobs/gpt2/sweep.yaml").read_text())
    template = document["spec"]["template"]
    template["entrypoint"] = (
        "python -m spotray.jobs.gpt2 --max-steps 30 --batch-size 8 --n-layer 1 --n-embd 32 --dropout 0 "
        f"--min-step-seconds 0.4 --workdir {tmp_path / 'scratch'} --learning-rate ${{lr}}"
    )
    document["spec"]["parameters"] = {"lr": {"type": "float", "values": LEARNING_RATES}}
    document["spec"]["search"] = {"algorithm": "grid"}
    document["spec"]["trials"] = {"max": 6, "parallel": 1}
    document["spec"]["earlyStopping"] = {"minSteps": 10, "reductionFactor": 3}
    return document


def run(manifest: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "spotray.cli", "run", str(manifest), "--local", "--workdir", str(workdir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=1500, check=False, cwd=workdir.parent)


def final_weights(workdir: Path) -> dict[str, Any]:
    [final] = (workdir / "final").iterdir()
    return load_file(final / "model.safetensors")


@pytest.mark.campaign
@pytest.mark.timeout(1800)
def test_a_trial_stopped_at_a_rung_is_promoted_later_and_ends_as_if_never_stopped(tmp_path: Path) -> None:
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(yaml.safe_dump(sweep_document(tmp_path)))
    workdir = tmp_path / "sweep"
    result = run(manifest, workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "trial 2 stops at step 10" in output
    for number in range(3, 7):
        assert f"trial {number} stops at step 10" in output, output[-3000:]
    assert "trial 2 (gpt2-lr-t2) resumes from its newest complete checkpoint" in output
    assert "best: trial 1 (gpt2-lr-t1)" in output or "best: trial 2 (gpt2-lr-t2)" in output
    assert "Failed" not in output
    assert (workdir / "sweep.png").read_bytes().startswith(b"\x89PNG"), "every trial's curve, stops marked"

    # The same trial alone, uninterrupted: the same final weights.
    alone = tmp_path / "alone"
    alone.mkdir()
    trial = yaml.safe_load((workdir / "gpt2-lr-t2.yaml").read_text())
    trial["spec"]["checkpoint"]["uri"] += "-alone"
    trial["spec"]["entrypoint"] = trial["spec"]["entrypoint"].replace(str(tmp_path / "scratch"), str(alone / "scratch"))
    (alone / "t2.yaml").write_text(yaml.safe_dump(trial))
    single = subprocess.run(
        [sys.executable, "-m", "spotray.cli", "run", str(alone / "t2.yaml"), "--local", "--workdir", str(alone / "wd")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    resumed, uninterrupted = final_weights(workdir / "gpt2-lr-t2"), final_weights(alone / "wd")
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        assert tensor.equal(uninterrupted[name]), f"{name} differs after the stop and the promotion"
