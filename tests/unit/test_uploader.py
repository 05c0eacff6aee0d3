"""Staging and the background uploader, on a directory store; one test injects a storage fault."""

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotray.contract.errors import CheckpointUploadError, StoreRequestError
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.checkpoints.uploader import CheckpointUploader, stage_checkpoint
from spotray.train.storage.store import LocalObjectStore
from tests.conftest import write_files

pytestmark = [pytest.mark.unit, pytest.mark.core]


def test_staged_files_survive_the_trainer_rotating_its_checkpoint(tmp_path: Path) -> None:
    source = write_files(tmp_path / "checkpoint-5", {"a.bin": b"a" * 100, "sub/b.bin": b"b"})
    staged = stage_checkpoint(source, tmp_path / "staging" / "checkpoint-5")
    assert (staged / "a.bin").stat().st_ino == (source / "a.bin").stat().st_ino  # a hard link, no copy
    for path in sorted(source.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert (staged / "a.bin").read_bytes() == b"a" * 100
    assert (staged / "sub/b.bin").read_bytes() == b"b"


def test_uploads_in_order_prunes_and_cleans_staging(tmp_path: Path) -> None:
    store = LocalObjectStore(parse_uri(str(tmp_path / "store")))
    uploaded: list[int] = []
    uploader = CheckpointUploader(store, keep=2, on_uploaded=lambda m, _s: uploaded.append(m.step))
    for step in (1, 2, 3):
        staged = write_files(tmp_path / f"staging/checkpoint-{step}", {"w.bin": bytes([step]) * 10})
        uploader.submit(staged, step, world_size=1)
        uploader.flush(timeout_s=30)  # one at a time: a checkpoint still waiting would be dropped for the next
    uploader.close()
    assert uploaded == [1, 2, 3]
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == 3
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert not any((tmp_path / "staging").iterdir())


class FailingStore(LocalObjectStore):
    """Refuses every upload, the way a bucket with a deny policy would."""

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        raise StoreRequestError("the store refused the upload", "fix the bucket policy")


def test_a_failed_upload_is_raised_in_the_training_thread(tmp_path: Path) -> None:
    uploader = CheckpointUploader(FailingStore(parse_uri(str(tmp_path / "store"))), keep=1)
    staged = write_files(tmp_path / "staging/checkpoint-1", {"w.bin": b"w"})
    uploader.submit(staged, 1, world_size=1)
    with pytest.raises(CheckpointUploadError, match="checkpoint-1") as caught:
        uploader.flush(timeout_s=10)
    assert "the store refused the upload" in str(caught.value)
    with pytest.raises(CheckpointUploadError):
        uploader.submit(write_files(tmp_path / "staging/checkpoint-2", {"w.bin": b"w"}), 2, world_size=1)


@dataclass
class GatedStore(LocalObjectStore):
    """Holds every upload until the file ``gate`` exists (a file, because uploads run in another process)."""

    gate: Path = Path("/nonexistent")

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        deadline = time.monotonic() + 30
        while not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        super().upload_files(pairs)


def test_flush_waits_for_the_upload_and_times_out_loudly(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    uploader = CheckpointUploader(GatedStore(parse_uri(str(tmp_path / "store")), gate), keep=1)
    uploader.submit(write_files(tmp_path / "staging/checkpoint-1", {"w.bin": b"w"}), 1, world_size=1)
    with pytest.raises(CheckpointUploadError, match="did not finish"):
        uploader.flush(timeout_s=0.2)
    gate.touch()
    uploader.flush(timeout_s=30)
    assert uploader.last_uploaded_step == 1


class CrashingStore(LocalObjectStore):
    """Kills the upload process outright, the way the OOM killer would."""

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        os._exit(137)


def test_an_upload_process_that_dies_every_time_is_reported(tmp_path: Path) -> None:
    uploader = CheckpointUploader(CrashingStore(parse_uri(str(tmp_path / "store"))), keep=1)
    uploader.submit(write_files(tmp_path / "staging/checkpoint-3", {"w.bin": b"w"}), 3, world_size=1)
    with pytest.raises(CheckpointUploadError, match=r"upload process died .* checkpoint-3 \(exit code 137\)"):
        uploader.flush(timeout_s=30)


@dataclass
class CrashingOnceStore(LocalObjectStore):
    """Kills the first upload process it runs in (a stray SIGKILL, the OOM killer), then works."""

    crashed_marker: Path = Path("/nonexistent")

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        if not self.crashed_marker.exists():
            self.crashed_marker.touch()
            os._exit(137)
        super().upload_files(pairs)


def test_an_upload_process_killed_once_is_replaced_and_the_checkpoint_lands(tmp_path: Path) -> None:
    store = CrashingOnceStore(parse_uri(str(tmp_path / "store")), tmp_path / "crashed")
    uploader = CheckpointUploader(store, keep=1)
    uploader.submit(write_files(tmp_path / "staging/checkpoint-3", {"w.bin": b"w"}), 3, world_size=1)
    # Two upload processes start (the first dies): seconds each, a minute or more on a loaded CI machine.
    uploader.flush(timeout_s=180)
    assert (tmp_path / "crashed").exists()
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == 3
    uploader.submit(write_files(tmp_path / "staging/checkpoint-4", {"w.bin": b"x"}), 4, world_size=1)
    uploader.close()
    assert uploader.last_uploaded_step == 4


def test_when_uploads_fall_behind_the_newest_checkpoint_wins(tmp_path: Path) -> None:
    """Staging holds the one uploading and the newest waiting; older waiting ones are dropped, counted."""
    gate = tmp_path / "gate"
    store = GatedStore(parse_uri(str(tmp_path / "store")), gate)
    uploaded: list[int] = []
    uploader = CheckpointUploader(store, keep=3, on_uploaded=lambda m, _s: uploaded.append(m.step))
    staging = tmp_path / "staging"
    uploader.submit(write_files(staging / "checkpoint-1", {"w.bin": b"1"}), 1, world_size=1)
    deadline = time.monotonic() + 30
    while uploader._jobs.qsize() and time.monotonic() < deadline:  # checkpoint-1 taken: it is uploading
        time.sleep(0.01)
    assert uploader.submit(write_files(staging / "checkpoint-2", {"w.bin": b"2"}), 2, world_size=1) == []
    assert uploader.submit(write_files(staging / "checkpoint-3", {"w.bin": b"3"}), 3, world_size=1) == [2]
    assert uploader.submit(write_files(staging / "checkpoint-4", {"w.bin": b"4"}), 4, world_size=1) == [3]
    assert sorted(p.name for p in staging.iterdir()) == ["checkpoint-1", "checkpoint-4"]  # bounded
    assert uploader.dropped == 2
    gate.touch()
    uploader.close()
    assert uploaded == [1, 4]
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == 4
