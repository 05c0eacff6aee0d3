"""`spotray run --local` end to end through the real command: a worker killed, the head lost, a spot notice.

One run, three faults, each recovered the way the cluster recovers it: Ray Train replaces a
SIGKILLed worker inside the attempt; a lost head (driver and Ray cluster SIGKILLed) ends the
attempt and the next one resumes; a SIGTERM to the driver drains the nodes, the workers take an
emergency checkpoint and the attempt exits with 143, and the next attempt resumes from it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from spotray.train.records.event_log import read_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# The notice reaches the workers 1-3 s after the SIGTERM (drain, Ray's poll, the callback's poll);
# at ~9 steps/s the run needs well over 30 steps left after --preempt-at or it may finish first.
MAX_STEPS = 100
SAVE_STEPS = 10


def short_manifest(tmp_path: Path, max_steps: int = MAX_STEPS) -> Path:
    document = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())
    document["metadata"]["name"] = "demo-test"
    document["spec"]["entrypoint"] = (
        f"python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size 8 --workdir {tmp_path}"
    )
    document["spec"]["checkpoint"]["everySteps"] = SAVE_STEPS
    path = tmp_path / "trainingrun.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


# Three recoveries in one run, about 6 minutes: a campaign (make test-campaign). make test covers
# each path on its own: the head loss (test_ray_training), a worker kill (test_cnn_job), a notice
# and the resume after it (test_local_cleanup).
@pytest.mark.campaign
@pytest.mark.timeout(1800)
def test_local_run_recovers_from_every_kind_of_loss(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    command = [
        sys.executable, "-m", "spotray.cli", "run", str(short_manifest(tmp_path)), "--local",
        "--workdir", str(workdir), "--kill-worker-at", "15", "--kill-all-at", "32", "--preempt-at", "45",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1700, check=False, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]

    events = list(read_events(workdir / "events.jsonl"))
    starts = [e for e in events if e["event"] == "start"]
    # fresh start, worker group restarted after the worker kill, attempt 2 after the head loss,
    # attempt 3 after the spot notice
    assert len(starts) == 4, output[-3000:]
    assert starts[0]["resumed_from"] is None
    resumed = [s["resumed_from"] for s in starts[1:]]
    kills = [15, 32]
    for at, resumed_from in zip(kills, resumed[:2], strict=True):
        assert at - SAVE_STEPS - 3 <= resumed_from <= at, (at, resumed)  # lost at most one interval (+ the poll)

    notice = next(e for e in events if e["event"] == "emergency_checkpoint")
    assert resumed[2] == notice["step"], "the attempt after the notice resumes from the emergency checkpoint"
    assert notice["seconds"] < 7.5, "the emergency checkpoint must be complete well within a 15 s notice"
    assert "attempts             3 (2 preempted, 0 failed)" in output
    # The head loss takes the Ray cluster and the notice drains it: attempts 2 and 3 each start a new one.
    assert "runs on the Ray cluster still standing" not in output
    # The plot and the summary count what the CLI counts: the worker restart stays inside attempt 1.
    assert [s["attempt"] for s in starts] == [1, 1, 2, 3]
    assert "3 attempt(s), 1 worker restart(s), 1 spot notice(s); goodput 0." in output

    end = [e for e in events if e["event"] == "end"]
    assert end
    assert end[-1]["step"] == MAX_STEPS
    assert f"checkpoint-{MAX_STEPS}" in output
    final_config = json.loads((workdir / "final" / f"checkpoint-{MAX_STEPS}" / "config.json").read_text())
    assert final_config["model_type"] == "gpt2"
    with Image.open(workdir / "loss.png") as image:
        assert image.format == "PNG"
        assert image.width > 500
        assert image.height > 300


def test_bad_manifest_is_refused_with_each_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: spotray.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: x}\nspec:\n  workers: {replicas: 0}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "spotray.cli", "run", str(path), "--local"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "spec.workers.replicas: must be >= 1, got 0" in result.stderr
    assert "spec.entrypoint: missing" in result.stderr
    assert "spec.checkpoint: missing" in result.stderr
