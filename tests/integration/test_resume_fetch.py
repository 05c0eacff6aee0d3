"""Fetching the checkpoint to resume from (issue #18) against a real SeaweedFS: ranged downloads hashed
as they arrive, a node's copy reused without reading it again, one download per node, and every rank
ending on rank 0's choice when the newest checkpoint is corrupt."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spotray.contract.errors import StoreRequestError
from spotray.train.checkpoints import checkpoint as checkpoint_module
from spotray.train.checkpoints.checkpoint import (
    VERIFIED_NAME,
    download_checkpoint,
    latest_complete_checkpoint,
    upload_checkpoint,
)
from spotray.train.checkpoints.resume import ResumeFetch
from spotray.train.storage.store import DOWNLOAD_PART_BYTES, S3ObjectStore
from tests.conftest import run_ranks, write_files

pytestmark = [pytest.mark.integration, pytest.mark.core]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plant(store: S3ObjectStore, tmp_path: Path, step: int, size: int = 3 * DOWNLOAD_PART_BYTES + 5) -> dict[str, bytes]:
    files = {"model.safetensors": os.urandom(size), "trainer_state.json": b'{"global_step": %d}' % step, "e": b""}
    upload_checkpoint(store, write_files(tmp_path / f"src-{step}", files), step, world_size=1)
    return files


class CountingReads:
    """Counts the ranges read from S3 (the reads themselves are the real ones)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = S3ObjectStore._read_range

        def counted(store: S3ObjectStore, key: str, offset: int, length: int | None) -> bytes:
            self.count += 1
            return real(store, key, offset, length)

        monkeypatch.setattr(S3ObjectStore, "_read_range", counted)


class CountingHashes:
    """Counts files hashed by reading them back (the hashing itself is the real one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = checkpoint_module.file_sha256

        def counted(path: Path) -> str:
            self.count += 1
            return real(path)

        monkeypatch.setattr(checkpoint_module, "file_sha256", counted)


def test_download_files_returns_each_files_hash_computed_as_it_arrived(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = plant(s3_store, tmp_path, 10)
    reads = CountingReads(monkeypatch)
    pairs = [(f"checkpoint-10/{name}", tmp_path / "got" / name) for name in files]
    digests = s3_store.download_files(pairs)
    for name, data in files.items():
        assert (tmp_path / "got" / name).read_bytes() == data
        assert digests[tmp_path / "got" / name] == sha(data)
    assert reads.count == 4 + 1  # the model in 4 ranges, the state in 1; the empty file needs none


def test_a_missing_key_fails_the_download_with_its_name(s3_store: S3ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(StoreRequestError) as caught:
        s3_store.download_files([("checkpoint-1/nothing-here", tmp_path / "x")])
    assert "download 1 file(s)" in str(caught.value)


def test_a_verified_copy_is_reused_without_a_download_or_a_second_read(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(s3_store, tmp_path, 10)
    info = latest_complete_checkpoint(s3_store)
    assert info is not None
    reads, hashes = CountingReads(monkeypatch), CountingHashes(monkeypatch)
    first = download_checkpoint(s3_store, info, tmp_path / "node")
    assert (reads.count, hashes.count) == (5, 0), "hashed as the bytes arrived, not read back"
    assert (first / VERIFIED_NAME).is_file()
    again = download_checkpoint(s3_store, info, tmp_path / "node")  # a worker restarted on this node
    assert again == first
    assert (reads.count, hashes.count) == (5, 0)


def test_a_copy_changed_since_it_was_verified_is_hashed_again_and_replaced(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = plant(s3_store, tmp_path, 10)
    info = latest_complete_checkpoint(s3_store)
    assert info is not None
    local = download_checkpoint(s3_store, info, tmp_path / "node")
    model = local / "model.safetensors"
    with model.open("r+b") as handle:  # same size, other bytes: only the checksum can tell
        handle.write(b"\0" * 64)
    reads, hashes = CountingReads(monkeypatch), CountingHashes(monkeypatch)
    local = download_checkpoint(s3_store, info, tmp_path / "node")
    assert hashes.count >= 1, "the changed copy was not checked"
    assert reads.count == 5, "the changed copy was not downloaded again"
    assert model.read_bytes() == files["model.safetensors"]


def test_the_processes_of_a_node_share_one_download(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(s3_store, tmp_path, 10, size=12 * DOWNLOAD_PART_BYTES)
    info = latest_complete_checkpoint(s3_store)
    assert info is not None
    reads = CountingReads(monkeypatch)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(download_checkpoint(s3_store, info, tmp_path / "node")))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert len(set(results)) == 1
    assert reads.count == 12 + 1, "more than one download of the same checkpoint on one node"


def test_a_resume_keeps_only_its_own_copy_on_the_node(s3_store: S3ObjectStore, tmp_path: Path) -> None:
    plant(s3_store, tmp_path, 10)
    node = tmp_path / "node"
    stale = write_files(node / "checkpoint-5", {"model.safetensors": b"old"})
    leftover = write_files(node / ".checkpoint-7.partial", {"model.safetensors": b"cut"})
    unrelated = write_files(node / "notes", {"keep.txt": b"mine"})
    fetch = ResumeFetch(s3_store, node)
    point = fetch.wait()
    assert point is not None
    assert point.step == 10
    assert fetch.fetch_s is not None
    assert fetch.waited_s is not None
    assert not stale.exists()
    assert not leftover.exists()
    assert unrelated.exists()
    assert (node / "checkpoint-10" / "model.safetensors").is_file()


def test_every_rank_ends_on_rank_0s_choice_when_the_newest_is_corrupt(
    s3_store: S3ObjectStore, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """torchrun, 2 processes: rank 1 bets on the newest checkpoint, whose bytes do not match its manifest;
    rank 0 falls back to the older one, and rank 1 takes that one too. On two nodes (a copy each) and on
    one node (one copy, shared)."""
    plant(s3_store, tmp_path, 10)
    plant(s3_store, tmp_path, 20)
    s3_store.put_bytes("checkpoint-20/trainer_state.json", b'{"global_step": 99}')  # same size, other bytes
    run_ranks(Path(__file__).with_name("resume_fetch_script.py"), [str(s3_store.uri), str(tmp_path / "out")], s3_env)
    for rank in (0, 1):
        assert (tmp_path / "out" / f"rank-{rank}.txt").read_text() == "10 10"  # two nodes, then one


KILLED_DOWNLOAD = """
import sys
from pathlib import Path
from spotray.train.checkpoints.checkpoint import download_checkpoint, latest_complete_checkpoint
from spotray.train.storage.store import open_store
store = open_store(sys.argv[1])
download_checkpoint(store, latest_complete_checkpoint(store), Path(sys.argv[2]))
"""


@pytest.mark.version_neutral
def test_a_download_killed_half_way_leaves_nothing_taken_for_a_copy(
    s3_store: S3ObjectStore, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL while a process downloads (holding the node's lock): the next fetch takes the lock, drops
    the partial download and ends with a verified copy."""
    files = plant(s3_store, tmp_path, 10, size=12 * DOWNLOAD_PART_BYTES)
    node = tmp_path / "node"
    child = subprocess.Popen([sys.executable, "-c", KILLED_DOWNLOAD, str(s3_store.uri), str(node)], env=s3_env)
    partial = node / ".checkpoint-10.partial" / "model.safetensors"
    deadline = time.monotonic() + 60
    while not (partial.is_file() and partial.stat().st_blocks > 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert partial.is_file(), "the download was not under way when killed; the test proved nothing"
    assert not (node / "checkpoint-10").exists()
    info = latest_complete_checkpoint(s3_store)
    assert info is not None
    local = download_checkpoint(s3_store, info, node)
    assert (local / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert not partial.parent.exists()
