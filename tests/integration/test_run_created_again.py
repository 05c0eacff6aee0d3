"""A run created again on the same checkpoint URI, through real local runs on one SeaweedFS (issue #69).

The issue's reproduction: two local runs, two ``SPOTRAY_CHECKPOINT_KEY`` values, one S3 server.
The second run's job skipped every checkpoint of the first ("has a signature that does not match the
run's key", in worker logs only), said "fresh start", trained from step 0 and wrote checkpoint-10 and
-20 over the first run's; the CLI printed nothing about it. Now the second run fails at once as bad
input, saying which checkpoint it cannot verify and what to do, and the first run's checkpoints are
untouched; with the same key it resumes from them (on a cluster, the namespace's key gives every run
the same one: controller/checkpoint_key_secret.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, CheckpointKey
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import list_checkpoints
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore
from tests.integration.test_attempt_contract import manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIRST_KEY, SECOND_KEY = "1" * 64, "2" * 64


def run_local(path: Path, workdir: Path, server: LocalS3Server, key: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "spotray.cli", "run", str(path), "--local", "--workdir", str(workdir)]
    env = {**os.environ, **server.env(), CHECKPOINT_KEY_ENV: key}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env)


def steps(server: LocalS3Server, uri: str, key: str | None) -> dict[int, bool]:
    store = S3ObjectStore(parse_uri(uri), server.config, checkpoint_key=CheckpointKey(key.encode()) if key else None)
    return {info.step: info.complete for info in list_checkpoints(store)}


@pytest.mark.timeout(900)
def test_a_run_created_again_with_another_key_refuses_and_with_the_same_key_resumes(
    tmp_path: Path, s3_server: LocalS3Server, s3_uri: str
) -> None:
    entrypoint = f"python -m spotray.jobs.gpt2 --max-steps 20 --batch-size 4 --workdir {tmp_path}/job"
    path = manifest(tmp_path, "again", entrypoint, checkpoint={"uri": s3_uri, "everySteps": 10, "keep": 3})
    s3_server.create_bucket("spotray-demo")  # the job's data shards (jobs/gpt2/trainingrun.yaml)

    first = run_local(path, tmp_path / "first", s3_server, FIRST_KEY)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert steps(s3_server, s3_uri, FIRST_KEY) == {20: True, 10: True}

    # Created again (another work directory: another run id) with another key, at a longer target.
    longer = manifest(
        tmp_path,
        "again",
        entrypoint.replace("--max-steps 20", "--max-steps 30"),
        checkpoint={"uri": s3_uri, "everySteps": 10, "keep": 3},
    )
    refused = run_local(longer, tmp_path / "second", s3_server, SECOND_KEY)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert "checkpoint-20" in refused.stdout, refused.stdout[-3000:]
    assert "SPOTRAY_CHECKPOINT_KEY" in refused.stdout, refused.stdout[-3000:]
    assert steps(s3_server, s3_uri, FIRST_KEY) == {20: True, 10: True}, "the first run's checkpoints are as they were"

    resumed = run_local(longer, tmp_path / "third", s3_server, FIRST_KEY)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert steps(s3_server, s3_uri, FIRST_KEY) == {30: True, 20: True, 10: True}
    assert "resumed from checkpoint-20" in resumed.stdout or "from step 20" in resumed.stdout, resumed.stdout[-3000:]
