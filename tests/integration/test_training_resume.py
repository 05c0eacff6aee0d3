"""The checkpoint core inside a real Trainer: a store that starts refusing uploads stops training loudly."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spotray.contract.errors import CheckpointUploadError
from spotray.contract.uris import parse_uri
from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.train import build_trainer
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_failing_upload_stops_training_loudly(s3_server: LocalS3Server, s3_uri: str, tmp_path: Path) -> None:
    """Credentials revoked mid-run: the next step raises instead of training on without a safe checkpoint."""
    revoked_config = replace(s3_server.config, secret_access_key="revoked")
    revoked = S3ObjectStore(parse_uri(s3_uri), revoked_config, RetryPolicy(deadline_s=5))
    job = Gpt2JobConfig(workdir=tmp_path, max_steps=300, batch_size=4)
    callback = S3CheckpointCallback(s3_uri, store=revoked, staging_dir=tmp_path / "staging")
    trainer = build_trainer(job, [callback], save_steps=5)
    with pytest.raises(CheckpointUploadError) as caught:
        trainer.train()
    assert "refused the credentials" in str(caught.value)
    assert trainer.state.global_step < 300  # stopped early, not merely at the final flush
    print(json.dumps({"stopped_at_step": trainer.state.global_step}))
