"""`--multirun hydra/launcher=spotray` on this machine (issue 40): Hydra's jobs become a local sweep's trials.

Two jobs of the GPT-2 Hydra app, both at once: one trains 10 steps and returns its loss; the other
asks for a learning rate the job refuses (bad input), so its trial fails at once and Hydra reports
that job failed with the trial's name. Nothing is mocked: each trial is a local run with its own Ray
cluster, and one embedded S3 server holds every trial's checkpoints under a prefix of its own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from spotray.train.records.event_log import read_events

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "jobs" / "gpt2" / "hydra_app.py"
TEMPLATE = REPO / "jobs" / "gpt2" / "hydra_trainingrun.yaml"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# In make test-campaign (161-217 s in make test, its slowest integration test: two local Ray clusters
# at once); the launcher's decisions are unit tests (tests/unit/test_hydra_launcher.py).
@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_a_multirun_runs_each_job_as_a_trial_and_reports_each_result(tmp_path: Path) -> None:
    name = f"hydra-it-{uuid.uuid4().hex[:6]}"
    sweep_dir = tmp_path / "multirun"
    command = [
        sys.executable, str(APP), "--multirun", "hydra/launcher=spotray",
        f"hydra.launcher.template={TEMPLATE}", f"hydra.launcher.name={name}", "hydra.launcher.parallel=2",
        f"hydra.sweep.dir={sweep_dir}",
        "max_steps=10", "batch_size=8", "n_layer=1", "n_embd=32", "dropout=0", "learning_rate=0.003,-1",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=840, check=False, cwd=tmp_path)
    finally:  # the job's scratch directories (python -m spotray.jobs.gpt2 --workdir's default)
        for scratch in (Path(tempfile.gettempdir()) / "spotray-gpt2").glob(f"{name}-t*"):
            shutil.rmtree(scratch, ignore_errors=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "a job failed, so the multirun did: " + output[-3000:]
    lines = [line for line in output.splitlines() if "spotray: job " in line]
    trained = next(line for line in lines if "learning_rate=0.003" in line)
    refused = next(line for line in lines if "learning_rate=-1" in line)
    assert " Succeeded, loss " in trained, output[-3000:]
    assert " Failed" in refused, output[-3000:]
    assert f"trial {name}-t" in refused
    assert "Error executing job with overrides" in output, "Hydra says which job failed"

    assert f"its log: {sweep_dir / 'spotray' / name}/{name}-t" in output, "where to read why"
    assert not (tmp_path / "outputs").exists(), "a trial's run of the app leaves no Hydra output directory"

    trial = trained.split("trial ")[1].split()[0]
    events = read_events(sweep_dir / "spotray" / name / trial / "events.jsonl")
    [complete] = [event for event in events if event["event"] == "checkpoint_complete" and event["step"] == 10]
    assert complete["uri"].endswith(f"/sweeps/hydra/{trial}/checkpoint-10"), "its own checkpoint prefix"
