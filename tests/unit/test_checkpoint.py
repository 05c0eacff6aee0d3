"""Manifest, latest-complete selection and pruning, on a directory store (no network)."""

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from spotray.contract.errors import Cause, CorruptCheckpointError, SpotrayError, cause_of
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints import checkpoint
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    build_manifest,
    complete_checkpoints,
    latest_complete_checkpoint,
    list_checkpoints,
    manifest_json,
    prune_checkpoints,
    upload_checkpoint,
    verify_local_checkpoint,
)
from spotray.train.storage.store import LocalObjectStore
from tests.conftest import write_files

pytestmark = [pytest.mark.unit, pytest.mark.core]

FILES = {"model.safetensors": b"m" * 1000, "optimizer.pt": b"o" * 2000, "nested/rng_state.pth": b"r" * 10}


class RecordingStore(LocalObjectStore):
    """A directory store that records the order of deletions."""

    deleted: list[str]

    def delete(self, keys: Sequence[str]) -> None:
        self.deleted = [*getattr(self, "deleted", []), *keys]
        super().delete(keys)


@pytest.fixture
def store(tmp_path: Path) -> RecordingStore:
    return RecordingStore(parse_uri(str(tmp_path / "store")))


@pytest.fixture
def local_checkpoint(tmp_path: Path) -> Path:
    return write_files(tmp_path / "local", FILES)


def test_manifest_lists_sizes_and_checksums(local_checkpoint: Path) -> None:
    manifest = build_manifest(local_checkpoint, step=30, world_size=4, resume={"samples_seen": 480})
    assert set(manifest.files) == set(FILES)
    assert manifest.files["optimizer.pt"].size == 2000
    assert len(manifest.files["model.safetensors"].sha256) == 64
    assert manifest.total_bytes == 3010
    assert manifest.world_size == 4
    assert "torch" in manifest.versions
    again = Manifest.from_json(manifest.to_json(), "here")
    assert again == manifest


@pytest.mark.parametrize(
    "payload",
    [b"{not json", b"[]", json.dumps({"format": 99}).encode(), json.dumps({"format": 1, "step": 1}).encode()],
)
def test_corrupt_manifest_is_named(payload: bytes) -> None:
    with pytest.raises(CorruptCheckpointError) as caught:
        Manifest.from_json(payload, "s3://b/run/checkpoint-7/spotray-manifest.json")
    assert "s3://b/run/checkpoint-7/spotray-manifest.json" in str(caught.value)


def sharded(files: int) -> Manifest:
    """A manifest of ``files`` shards with names and sizes like torch's distributed checkpoints'."""
    entries = {f"__{rank}_0.distcp": FileEntry(1_234_567_890, "e3" * 32) for rank in range(files)}
    return Manifest(step=1_000_000, world_size=files, files=entries, created_at=1763869990.512345)


def test_a_manifest_of_nine_thousand_files_is_written_and_read_back() -> None:
    manifest = sharded(9_000)
    assert Manifest.from_json(manifest_json(manifest, None), "here") == manifest


def test_a_manifest_past_the_readers_bounds_is_refused_when_saved_as_bad_input() -> None:
    with pytest.raises(SpotrayError) as caught:
        manifest_json(sharded(12_000), None)
    assert "checkpoint-1000000 has 12000 files" in caught.value.problem
    assert "fewer, larger files" in caught.value.fix
    assert cause_of(caught.value) == Cause.BAD_INPUT


def test_a_checkpoint_with_too_many_files_is_refused_before_any_file_goes_up(
    store: RecordingStore, local_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "MAX_MANIFEST_VALUES", 10)  # three files and the versions take more
    with pytest.raises(SpotrayError, match="too many for its manifest"):
        upload_checkpoint(store, local_checkpoint, step=5, world_size=1)
    assert store.list() == []


def test_verify_local_checkpoint_detects_each_kind_of_damage(local_checkpoint: Path) -> None:
    manifest = build_manifest(local_checkpoint, step=1, world_size=1)
    verify_local_checkpoint(local_checkpoint, manifest)
    (local_checkpoint / "model.safetensors").write_bytes(b"M" * 1000)  # same size, other bytes
    with pytest.raises(CorruptCheckpointError, match="SHA-256"):
        verify_local_checkpoint(local_checkpoint, manifest)
    (local_checkpoint / "model.safetensors").write_bytes(b"m" * 999)
    with pytest.raises(CorruptCheckpointError, match="999 bytes"):
        verify_local_checkpoint(local_checkpoint, manifest)
    (local_checkpoint / "model.safetensors").unlink()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        verify_local_checkpoint(local_checkpoint, manifest)


def test_empty_store_means_fresh_start(store: RecordingStore) -> None:
    assert latest_complete_checkpoint(store) is None
    assert list_checkpoints(store) == []


def test_latest_complete_skips_unfinished_and_damaged(
    store: RecordingStore, local_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (10, 20, 30, 40):
        upload_checkpoint(store, local_checkpoint, step, world_size=1)
    store.delete([f"checkpoint-40/{MANIFEST_NAME}"])  # 40: upload died before the manifest
    store.put_bytes(f"checkpoint-30/{MANIFEST_NAME}", b"garbage")  # 30: corrupt manifest
    store.put_bytes("checkpoint-20/optimizer.pt", b"short")  # 20: a file does not match
    store.put_bytes("checkpoint-50/model.safetensors", b"partial")  # 50: only some files
    store.put_bytes("not-a-checkpoint/x", b"x")

    with caplog.at_level(logging.WARNING):
        latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == 10
    by_step = {c.step: c for c in list_checkpoints(store)}
    assert sorted(by_step) == [10, 20, 30, 40, 50]
    assert "no manifest" in (by_step[40].problem or "")
    assert "corrupt" in (by_step[30].problem or "")
    assert "optimizer.pt has 5 bytes" in (by_step[20].problem or "")
    # The corrupt manifest is named in a warning; an unfinished upload is not worth one.
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "checkpoint-30" in warnings
    assert "checkpoint-40" not in warnings


def test_manifest_for_another_step_is_not_complete(store: RecordingStore, local_checkpoint: Path) -> None:
    manifest = upload_checkpoint(store, local_checkpoint, 10, world_size=1)
    store.upload_files([(local_checkpoint / n, f"checkpoint-20/{n}") for n in FILES])
    store.put_bytes(f"checkpoint-20/{MANIFEST_NAME}", manifest.to_json())
    assert [c.step for c in complete_checkpoints(store)] == [10]


def test_upload_writes_manifest_last_and_replaces_old_attempt(store: RecordingStore, local_checkpoint: Path) -> None:
    upload_checkpoint(store, local_checkpoint, 10, world_size=1)
    store.put_bytes("checkpoint-10/stale-from-old-attempt", b"x")
    store.deleted = []
    upload_checkpoint(store, local_checkpoint, 10, world_size=2)
    assert store.deleted[0] == f"checkpoint-10/{MANIFEST_NAME}"  # retracted before anything else
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.manifest is not None
    assert latest.manifest.world_size == 2
    manifest_mtime = (store.root / "checkpoint-10" / MANIFEST_NAME).stat().st_mtime_ns
    assert all((store.root / "checkpoint-10" / n).stat().st_mtime_ns <= manifest_mtime for n in FILES)


def test_prune_keeps_newest_complete_and_spares_uploads_in_flight(
    store: RecordingStore, local_checkpoint: Path
) -> None:
    for step in (10, 20, 30, 40, 50):
        upload_checkpoint(store, local_checkpoint, step, world_size=1)
    store.delete([f"checkpoint-20/{MANIFEST_NAME}"])  # abandoned, older than the newest complete
    store.put_bytes("checkpoint-60/model.safetensors", b"in flight")  # newer than any complete
    store.deleted = []
    deleted = prune_checkpoints(store, keep=2)
    assert deleted == [10, 20, 30]
    assert [c.step for c in list_checkpoints(store)] == [60, 50, 40]
    # A checkpoint being deleted loses its manifest before its files.
    first_of_10 = next(k for k in store.deleted if k.startswith("checkpoint-10/"))
    assert first_of_10 == f"checkpoint-10/{MANIFEST_NAME}"


def test_prune_never_deletes_when_nothing_newer_is_complete(store: RecordingStore, local_checkpoint: Path) -> None:
    upload_checkpoint(store, local_checkpoint, 10, world_size=1)
    store.put_bytes("checkpoint-20/model.safetensors", b"partial")
    assert prune_checkpoints(store, keep=1) == []
    assert [c.step for c in list_checkpoints(store)] == [20, 10]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(store, keep=0)


def test_the_latest_complete_checkpoint_reads_no_manifest_older_than_it(
    store: RecordingStore, local_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller asks this of every running run: one LIST and one manifest read, not one per checkpoint."""
    for step in (10, 20, 30):
        upload_checkpoint(store, local_checkpoint, step, world_size=1)
    read: list[str] = []
    original = LocalObjectStore.get_bytes

    def recording_get_bytes(self: LocalObjectStore, key: str, **kwargs: object) -> bytes:
        read.append(key)
        return original(self, key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalObjectStore, "get_bytes", recording_get_bytes)
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == 30
    assert read == [f"checkpoint-30/{MANIFEST_NAME}"]
