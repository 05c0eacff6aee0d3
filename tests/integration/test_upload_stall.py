"""While the store answers errors, the uploader says so: the store's answer and since when, not
"checkpoint less often" (issue 72). Real SeaweedFS behind the fault proxy answering 500.

The upload process retries the fault; the training side hears of it at once (``on_stall``), a
checkpoint dropped meanwhile is blamed on the fault, and when the store answers again the stall
ends and the newest checkpoint completes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bench.campaigns.fault_proxy import FaultProxy
from spotray.contract.uris import parse_uri
from spotray.local.progress import ProgressView
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.checkpoints.upload_worker import UploadStall
from spotray.train.checkpoints.uploader import CheckpointUploader
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore
from tests.conftest import TEST_BUCKET, write_files

pytestmark = pytest.mark.integration


def wait_for(what: str, ready: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.1)


def staged(root: Path, step: int) -> Path:
    return write_files(root / f"staged-{step}", {"model.safetensors": bytes(1000 + step), "trainer_state.json": b"{}"})


def test_uploads_that_meet_a_failing_store_name_its_answer_and_recover(
    s3_server: LocalS3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with FaultProxy(s3_server.port) as proxy:
        config = replace(s3_server.config, endpoint_url=proxy.endpoint_url)
        store = S3ObjectStore(
            parse_uri(f"s3://{TEST_BUCKET}/stall-{time.time_ns()}"), config, retry=RetryPolicy(deadline_s=120.0)
        )
        heard: list[UploadStall | None] = []
        uploader = CheckpointUploader(store, keep=2, on_stall=heard.append)
        try:
            proxy.set_mode("error500")
            uploader.submit(staged(tmp_path, 10), 10, world_size=1)
            wait_for("stall reported", lambda: heard)
            stall = heard[0]
            assert stall is not None
            assert stall.fault.startswith("500 "), stall  # the proxy's answer, as the store gave it
            assert uploader.stall is not None

            # checkpoint-20 waits behind the stalled 10; checkpoint-30 replaces it: the warning names the fault.
            uploader.submit(staged(tmp_path, 20), 20, world_size=1)
            uploader.submit(staged(tmp_path, 30), 30, world_size=1)
            dropped = [r.getMessage() for r in caplog.records if "dropped checkpoint-20" in r.getMessage()]
            assert dropped, [r.getMessage() for r in caplog.records]
            assert "stalled since" in dropped[0]
            assert f"the store answers {stall.fault}" in dropped[0]
            assert "checkpoint less often" not in dropped[0]

            proxy.set_mode("pass")
            uploader.flush(timeout_s=120)
        finally:
            proxy.set_mode("pass")  # a failed assertion must not leave close() waiting on the fault
            uploader.close()
    assert heard[-1] is None, heard  # the stall ended once uploads flowed again
    assert uploader.stall is None
    latest = latest_complete_checkpoint(S3ObjectStore(store.uri, s3_server.config))  # the proxy is gone
    assert latest is not None
    assert latest.step == 30
    assert any("flow again" in r.getMessage() for r in caplog.records)


def test_the_local_progress_view_shows_a_stall_while_it_lasts(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        view = ProgressView(stream=stream, max_steps=100)
        view.on_event({"event": "upload_stalled", "since": time.time(), "fault": "503 SlowDown", "action": "upload"})
        assert "uploads stalled since" in view.line()
        view.on_event({"event": "upload_flowing"})
        assert "stalled" not in view.line()
    text = out.read_text()
    assert "the store answers 503 SlowDown (retrying)" in text
    assert "uploads flow again" in text
