"""Real training processes: killed with SIGKILL at a random step, resumed from S3, bit-identical."""

import json
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs.gpt2.train import Gpt2JobConfig, build_trainer
from train.callback import S3CheckpointCallback
from train.checkpoint import latest_complete_checkpoint
from train.errors import CheckpointUploadError
from train.events import read_events
from train.local_s3 import LocalS3Server
from train.store import RetryPolicy, S3ObjectStore, parse_uri

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_STEPS = 40
SAVE_STEPS = 10


def job_command(uri: str, workdir: Path) -> list[str]:
    return [
        sys.executable, "-m", "jobs.gpt2",
        "--checkpoint-uri", uri,
        "--workdir", str(workdir),
        "--max-steps", str(MAX_STEPS),
        "--save-steps", str(SAVE_STEPS),
        "--batch-size", "8",
        "--events", str(workdir / "events.jsonl"),
    ]  # fmt: skip


def run_to_end(uri: str, workdir: Path, env: dict[str, str]) -> None:
    result = subprocess.run(
        job_command(uri, workdir), env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]


def run_and_kill_at(uri: str, workdir: Path, env: dict[str, str], kill_step: int) -> int:
    """Start the job; SIGKILL it at ``kill_step`` or later, once a first checkpoint is complete.

    Returns the last step it logged.
    """
    events = workdir / "events.jsonl"
    child = subprocess.Popen(job_command(uri, workdir), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    last = 0
    while time.monotonic() < deadline and child.poll() is None:
        logged = list(read_events(events))
        steps = [e["step"] for e in logged if e["event"] == "step"]
        last = steps[-1] if steps else 0
        if last >= kill_step and any(e["event"] == "checkpoint_complete" for e in logged):
            break
        time.sleep(0.02)
    assert child.poll() is None, "the job ended before it could be killed"
    child.kill()
    child.wait()
    return last


def final_weights(store: S3ObjectStore, tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    """The weights of the last checkpoint, which must be the final step's."""
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == MAX_STEPS
    store.download_files([(f"{latest.prefix}/model.safetensors", tmp_path / name)])
    return load_file(tmp_path / name)


def test_killed_and_resumed_run_ends_with_the_same_weights(
    s3_server: LocalS3Server, s3_env: dict[str, str], s3_uri: str, tmp_path: Path
) -> None:
    straight_uri, killed_uri = f"{s3_uri}/straight", f"{s3_uri}/killed"
    run_to_end(straight_uri, tmp_path / "straight", s3_env)

    seed = random.randrange(1_000_000)
    kill_step = random.Random(seed).randint(SAVE_STEPS + 2, MAX_STEPS - 2)
    print(f"kill step {kill_step} (random seed {seed})")
    killed_at = run_and_kill_at(killed_uri, tmp_path / "killed", s3_env, kill_step)
    run_to_end(killed_uri, tmp_path / "killed", s3_env)

    starts = [e for e in read_events(tmp_path / "killed" / "events.jsonl") if e["event"] == "start"]
    assert len(starts) == 2
    assert starts[0]["resumed_from"] is None
    resumed_from = starts[1]["resumed_from"]
    assert resumed_from is not None
    assert resumed_from <= killed_at
    # Lost: the steps since the last checkpoint, plus at most one more interval if the next
    # checkpoint's upload was still in flight when the process died.
    assert killed_at - resumed_from < 2 * SAVE_STEPS

    straight = final_weights(S3ObjectStore(parse_uri(straight_uri), s3_server.config), tmp_path, "a.safetensors")
    resumed = final_weights(S3ObjectStore(parse_uri(killed_uri), s3_server.config), tmp_path, "b.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), f"{name} differs after resume (kill at {kill_step})"


def test_a_failing_upload_stops_training_loudly(s3_server: LocalS3Server, s3_uri: str, tmp_path: Path) -> None:
    """Credentials revoked mid-run: the next step raises instead of training on without a safe checkpoint."""
    revoked_config = replace(s3_server.config, secret_access_key="revoked")
    revoked = S3ObjectStore(parse_uri(s3_uri), revoked_config, RetryPolicy(deadline_s=5))
    job = Gpt2JobConfig(checkpoint_uri=s3_uri, workdir=tmp_path, max_steps=300, save_steps=5, batch_size=4)
    trainer = build_trainer(job, [S3CheckpointCallback(s3_uri, store=revoked, staging_dir=tmp_path / "staging")])
    with pytest.raises(CheckpointUploadError) as caught:
        trainer.train()
    assert "refused the credentials" in str(caught.value)
    assert trainer.state.global_step < 300  # stopped early, not merely at the final flush
    print(json.dumps({"stopped_at_step": trainer.state.global_step}))
