"""The CNN job (Ray Data input, a checkpoint per epoch) through `spotray run --local`, with a worker killed.

A Ray Train worker is SIGKILLed in the second epoch; Ray Train replaces the worker group, which
resumes from the first epoch's checkpoint (this job resumes at epoch boundaries) and finishes. The
model it leaves in the store classifies freshly generated images far better than chance.
"""

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from spotray.jobs.cnn.data import NUM_CLASSES, ShapesSpec, generate
from spotray.jobs.cnn.train import load_model
from spotray.train.records.event_log import read_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 2
GLOBAL_BATCH = 32
WORKERS = 2
STEPS_PER_EPOCH = (ShapesSpec().num_samples // WORKERS) // (GLOBAL_BATCH // WORKERS)
KILL_AT = STEPS_PER_EPOCH + 15  # well inside the second epoch


def short_manifest(tmp_path: Path) -> Path:
    document = yaml.safe_load((REPO / "jobs/cnn/trainingrun.yaml").read_text())
    document["metadata"]["name"] = "cnn-test"
    document["spec"]["entrypoint"] = (
        f"python -m spotray.jobs.cnn --epochs {EPOCHS} --batch-size {GLOBAL_BATCH} --workdir {tmp_path / 'scratch'}"
    )
    assert document["spec"]["workers"]["replicas"] == WORKERS
    path = tmp_path / "trainingrun.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_to_end(command: list[str], timeout_s: float) -> tuple[int, str]:
    """Run `spotray run`; past the timeout, Ctrl-C it so that it stops its Ray cluster and S3 server."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            output, _ = process.communicate(timeout=120)
            pytest.fail(f"`spotray run` took more than {timeout_s:.0f} s:\n{output[-5000:]}")
    return process.returncode, output


def held_out_accuracy(checkpoint_dir: Path) -> float:
    """Accuracy on images the job never saw: the same classes drawn from another seed."""
    model = load_model(checkpoint_dir).eval()
    images, labels = generate(ShapesSpec(samples_per_class=50, seed=ShapesSpec().seed + 1))
    with torch.no_grad():
        predicted = model(torch.from_numpy(images)).argmax(dim=1).numpy()
    return float(np.mean(predicted == labels))


# About 3.5 minutes on 2 cores: a campaign (make test-campaign), to keep make test within 30 minutes.
# Worker kills mid-run are covered in make test by the e2e spot-loss test and, sample-exact, by the
# chaos full runs (make chaos); this one is the CNN example's own epoch-based resume.
@pytest.mark.campaign
def test_worker_killed_mid_epoch_resumes_from_the_last_epoch(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    command = [
        sys.executable, "-m", "spotray.cli", "run", str(short_manifest(tmp_path)), "--local",
        "--workdir", str(workdir), "--kill-worker-at", str(KILL_AT),
    ]  # fmt: skip
    returncode, output = run_to_end(command, timeout_s=540)
    assert returncode == 0, output[-5000:]
    assert "SIGKILL to Ray Train worker rank 1" in output, output[-3000:]

    events = list(read_events(workdir / "events.jsonl"))
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2, output[-3000:]  # the fresh start, then the replaced worker group
    assert starts[0]["resumed_from"] is None
    assert starts[1]["resumed_from"] == STEPS_PER_EPOCH, "resumes from the checkpoint of epoch 1"
    assert starts[1]["epoch"] == 1
    assert len([e for e in events if e["event"] == "worker_start"]) == 2 * WORKERS
    assert [e["step"] for e in events if e["event"] == "checkpoint_complete"] == [
        STEPS_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)
    ]

    steps = [e for e in events if e["event"] == "step"]
    assert steps[-1]["step"] == steps[-1]["max_steps"] == EPOCHS * STEPS_PER_EPOCH
    killed_attempt = [e["step"] for e in steps if e["time"] < starts[1]["time"]]
    assert max(killed_attempt) >= KILL_AT, "the worker was killed in the second epoch, after its first steps"
    epochs = [e for e in events if e["event"] == "epoch_end"]
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS))
    first_loss = steps[0]["loss"]
    assert first_loss > 2.0  # about ln(10): a guess among ten classes
    assert epochs[-1]["loss"] < first_loss / 2, epochs
    assert epochs[-1]["accuracy"] > 3 / NUM_CLASSES, epochs

    end = [e for e in events if e["event"] == "end"]
    assert len(end) == 1
    assert end[0]["step"] == EPOCHS * STEPS_PER_EPOCH
    final_dir = workdir / "final" / f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}"
    assert f"load it with         spotray.jobs.cnn.train.load_model('{final_dir}')" in output
    assert held_out_accuracy(final_dir) > 4 / NUM_CLASSES
