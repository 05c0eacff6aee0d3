"""Checkpoints under real faults: an upload killed half-way, corrupt bytes, and S3 going away."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    latest_complete_checkpoint,
    list_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.resume import fetch_resume_checkpoint
from spotray.train.checkpoints.uploader import CheckpointUploader
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore
from tests.conftest import TEST_BUCKET, write_files

pytestmark = pytest.mark.integration

# The upload process, killed by the test at the worst moment: its data files are all in the store and
# its manifest not yet. It says so and waits there, so the kill lands in that window every time (a
# kill timed from outside raced the upload: on a loaded machine the whole upload, manifest included,
# once finished before the first listing saw any of it).
UPLOAD_SCRIPT = """
import sys, time
from pathlib import Path
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME, upload_checkpoint
from spotray.train.storage.store import open_store
store = open_store(sys.argv[1])
put_bytes = store.put_bytes
def put_bytes_but_the_manifest(key, data, **kwargs):
    if key.endswith(MANIFEST_NAME):
        print("DATA-UP", flush=True)
        time.sleep(600)
    return put_bytes(key, data, **kwargs)
store.put_bytes = put_bytes_but_the_manifest
upload_checkpoint(store, Path(sys.argv[2]), int(sys.argv[3]), world_size=1)
"""


def test_upload_killed_half_way_is_never_chosen(
    s3_store: S3ObjectStore, s3_env: dict[str, str], tmp_path: Path
) -> None:
    small = write_files(tmp_path / "small", {"model.safetensors": b"m" * 1000, "trainer_state.json": b"{}"})
    upload_checkpoint(s3_store, small, 20, world_size=1)
    big = write_files(
        tmp_path / "big",
        {"model.safetensors": os.urandom(8 << 20), "optimizer.pt": os.urandom(16 << 20), "z.json": b"{}"},
    )
    command = [sys.executable, "-c", UPLOAD_SCRIPT, str(s3_store.uri), str(big), "30"]
    child = subprocess.Popen(command, env=s3_env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "DATA-UP", "the upload ended before its manifest"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)

    keys = sorted(o.key for o in s3_store.list("checkpoint-30/"))
    assert keys == ["checkpoint-30/model.safetensors", "checkpoint-30/optimizer.pt", "checkpoint-30/z.json"]
    assert [(c.step, c.complete) for c in list_checkpoints(s3_store)] == [(30, False), (20, True)]
    resume = fetch_resume_checkpoint(s3_store, tmp_path / "resume")
    assert resume is not None
    assert resume.step == 20
    assert (resume.local_dir / "model.safetensors").read_bytes() == b"m" * 1000


def test_corrupt_bytes_fall_back_to_the_previous_checkpoint(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (10, 20):
        upload_checkpoint(s3_store, write_files(tmp_path / f"c{step}", {"w.bin": bytes([step]) * 4096}), step, 1)
    s3_store.put_bytes("checkpoint-20/w.bin", b"\xff" * 4096)  # same size: only the checksum can tell
    latest = latest_complete_checkpoint(s3_store)
    assert latest is not None
    assert latest.step == 20  # listing cannot see it...
    resume = fetch_resume_checkpoint(s3_store, tmp_path / "resume")
    assert resume is not None
    assert resume.step == 10  # ...the download's verification does
    assert "checkpoint-20" in caplog.text
    assert "SHA-256" in caplog.text


@pytest.mark.slow
def test_s3_outage_during_upload_is_ridden_out(tmp_path: Path) -> None:
    """Kill the S3 server (SIGKILL) with an upload queued; bring it back; the checkpoint lands."""
    with LocalS3Server(tmp_path / "s3") as server:
        server.create_bucket(TEST_BUCKET)
        store = S3ObjectStore(parse_uri(f"s3://{TEST_BUCKET}/outage"), server.config, RetryPolicy(deadline_s=120))
        uploader = CheckpointUploader(store, keep=2)
        staged = write_files(tmp_path / "staging/checkpoint-7", {"w.bin": os.urandom(8 << 20), "s.json": b"{}"})
        server.kill()
        uploader.submit(staged, 7, world_size=1)
        time.sleep(4)  # several retries hit a closed port
        assert uploader.last_uploaded_step is None
        server.start()
        uploader.flush(timeout_s=120)
        latest = latest_complete_checkpoint(store)
        assert latest is not None
        assert latest.step == 7
        uploader.close()
