"""A run's checkpoint key (issue #38, item 4): a writer of the bucket who lacks it cannot forge a
checkpoint that a keyed reader takes for complete, so no byte of a forged one is ever loaded.

On a directory store; the same code reads S3 (tests/integration/test_checkpoint_key_s3.py runs a job).
"""

import json
import pickle
from pathlib import Path

import pytest

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, SIGNATURE_FIELD, CheckpointKey
from spotray.contract.errors import Cause, CorruptCheckpointError, SpotrayError, cause_of
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    Manifest,
    build_manifest,
    download_checkpoint,
    latest_complete_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.node_parts import (
    NodePart,
    NodeSave,
    part_key,
    upload_node_part,
    upload_shared_checkpoint,
)
from spotray.train.storage.store import LocalObjectStore, S3ObjectStore, StoreConfig, open_store
from tests.conftest import write_files

pytestmark = [pytest.mark.unit, pytest.mark.core]

KEY = CheckpointKey(b"k" * 64)
OTHER_KEY = CheckpointKey(b"o" * 64)
FILES = {"model.safetensors": b"m" * 1000, "optimizer.pt": b"o" * 2000, "rng_state.pth": b"r" * 10}
EVIL = {"model.safetensors": b"M" * 1000, "optimizer.pt": b"cos\nsystem\n" + b"x" * 1989, "rng_state.pth": b"R" * 10}


def stores(root: Path) -> tuple[LocalObjectStore, LocalObjectStore]:
    """The run's view of its bucket (with its key) and a bucket writer's (the same bucket, no key)."""
    uri = parse_uri(str(root / "bucket"))
    return LocalObjectStore(uri, checkpoint_key=KEY), LocalObjectStore(uri)


def forge(writer: LocalObjectStore, local: Path, step: int, key: CheckpointKey | None = None) -> None:
    """What a writer of the bucket can do: a checkpoint complete by every size, its manifest written
    as spotray writes one, signed with ``key`` if the writer has one (not the run's)."""
    manifest = build_manifest(local, step, world_size=1)
    writer.upload_files([(local / name, f"checkpoint-{step}/{name}") for name in EVIL])
    writer.put_bytes(f"checkpoint-{step}/{MANIFEST_NAME}", manifest.to_json(key))


@pytest.fixture
def genuine(tmp_path: Path) -> Path:
    return write_files(tmp_path / "genuine", FILES)


@pytest.fixture
def evil(tmp_path: Path) -> Path:
    return write_files(tmp_path / "evil", EVIL)


def test_a_keyed_store_signs_its_manifests_and_a_keyed_reader_takes_them(tmp_path: Path, genuine: Path) -> None:
    run, _ = stores(tmp_path)
    upload_checkpoint(run, genuine, 10, world_size=1)
    stored = json.loads((run.root / "checkpoint-10" / MANIFEST_NAME).read_bytes())
    assert len(stored[SIGNATURE_FIELD]) == 64
    latest = latest_complete_checkpoint(run)
    assert latest is not None
    assert latest.step == 10
    assert latest.manifest is not None
    assert latest.manifest.signed


@pytest.mark.parametrize(
    ("forger_key", "problem"),
    [(None, "is not signed"), (OTHER_KEY, "signature that does not match the run's key")],
    ids=["unsigned", "another-key"],
)
def test_a_forged_checkpoint_is_skipped_for_the_newest_signed_one(
    tmp_path: Path, genuine: Path, evil: Path, forger_key: CheckpointKey | None, problem: str
) -> None:
    run, writer = stores(tmp_path)
    upload_checkpoint(run, genuine, 10, world_size=1)
    forge(writer, evil, 20, forger_key)

    latest = latest_complete_checkpoint(run)
    assert latest is not None
    assert latest.step == 10, "the forged checkpoint-20 was taken"
    forged = next(c for c in list_checkpoints(run) if c.step == 20)
    assert problem in (forged.problem or ""), forged.problem
    # The writer's own, keyless view would take it: the key is what tells them apart.
    assert latest_complete_checkpoint(writer).step == 20  # type: ignore[union-attr]


def test_a_signed_manifest_changed_by_a_writer_is_refused(tmp_path: Path, genuine: Path, evil: Path) -> None:
    """Swap one file and patch its checksum into the genuine manifest, keeping the genuine HMAC."""
    run, writer = stores(tmp_path)
    upload_checkpoint(run, genuine, 10, world_size=1)
    stored = json.loads((run.root / "checkpoint-10" / MANIFEST_NAME).read_bytes())
    swapped = build_manifest(evil, 10, world_size=1).files["optimizer.pt"]
    stored["files"]["optimizer.pt"] = {"size": swapped.size, "sha256": swapped.sha256}
    writer.upload_files([(evil / "optimizer.pt", "checkpoint-10/optimizer.pt")])
    writer.put_bytes(f"checkpoint-10/{MANIFEST_NAME}", json.dumps(stored).encode())

    assert latest_complete_checkpoint(run) is None
    with pytest.raises(CorruptCheckpointError, match="does not match the run's key") as refused:
        Manifest.from_json(json.dumps(stored).encode(), "checkpoint-10", KEY)
    assert cause_of(refused.value) is Cause.BAD_INPUT


def test_a_forged_checkpoint_never_reaches_the_disk_of_a_keyed_download(
    tmp_path: Path, genuine: Path, evil: Path
) -> None:
    run, writer = stores(tmp_path)
    upload_checkpoint(run, genuine, 10, world_size=1)
    forge(writer, evil, 20)
    latest = latest_complete_checkpoint(run)
    assert latest is not None
    fetched = download_checkpoint(run, latest, tmp_path / "resume")
    assert fetched.name == "checkpoint-10"
    assert (fetched / "optimizer.pt").read_bytes() == FILES["optimizer.pt"]
    assert not (tmp_path / "resume" / "checkpoint-20").exists()


def test_forged_checkpoints_newer_than_the_signed_ones_make_pruning_keep_the_signed_ones(
    tmp_path: Path, genuine: Path, evil: Path
) -> None:
    run, writer = stores(tmp_path)
    for step in (10, 20):
        upload_checkpoint(run, genuine, step, world_size=1)
    for step in (30, 40):
        forge(writer, evil, step)
    assert prune_checkpoints(run, keep=2) == []
    assert [c.step for c in list_checkpoints(run) if c.complete] == [20, 10]


def test_a_reader_without_the_key_takes_signed_and_unsigned_manifests_alike(tmp_path: Path, genuine: Path) -> None:
    """The controller (status) and a `spotray pull` without the key: nothing to check with, and they say so."""
    run, writer = stores(tmp_path)
    upload_checkpoint(run, genuine, 10, world_size=1)
    upload_checkpoint(writer, genuine, 20, world_size=1)
    by_step = {c.step: c for c in list_checkpoints(writer)}
    assert by_step[10].complete
    assert by_step[10].manifest is not None
    assert by_step[10].manifest.signed
    assert by_step[20].complete
    assert by_step[20].manifest is not None
    assert not by_step[20].manifest.signed


def test_a_part_signature_is_not_valid_as_a_manifest_signature() -> None:
    """The purpose is in the HMAC: a signed node part (which a node > 0 writes) cannot stand as a manifest."""
    content = {"format": 1, "step": 10, "world_size": 1, "files": {}, "created_at": 1.0, "versions": {}, "resume": {}}
    as_part = KEY.sign("checkpoint node part", content)
    with pytest.raises(CorruptCheckpointError, match="does not match"):
        Manifest.from_json(json.dumps(as_part).encode(), "x", KEY)
    assert Manifest.from_json(json.dumps(KEY.sign("checkpoint manifest", content)).encode(), "x", KEY).signed


def test_node_zero_refuses_a_part_not_signed_with_the_run_key(tmp_path: Path, genuine: Path) -> None:
    run, writer = stores(tmp_path)
    share = NodeSave(node=0, nodes=2, save_id="s1")
    forged = NodePart(1, "s1", build_manifest(genuine, 10, 2).files)
    writer.put_bytes(part_key(10, 1), forged.to_json())
    with pytest.raises(CorruptCheckpointError, match=r"node part .* is not signed"):
        upload_shared_checkpoint(run, genuine, 10, 2, {}, share=share, parts_timeout_s=5)
    assert latest_complete_checkpoint(run) is None


def test_node_parts_signed_with_the_run_key_complete_a_signed_checkpoint(tmp_path: Path) -> None:
    run, _ = stores(tmp_path)
    node0 = write_files(tmp_path / "n0", {"model.safetensors": b"m" * 100})
    node1 = write_files(tmp_path / "n1", {"optimizer-1.pt": b"o" * 100})
    upload_node_part(run, node1, 10, NodeSave(1, 2, "s1", ("optimizer-1.pt",)))
    manifest = upload_shared_checkpoint(run, node0, 10, 2, {}, share=NodeSave(0, 2, "s1"), parts_timeout_s=5)
    assert set(manifest.files) == {"model.safetensors", "optimizer-1.pt"}
    latest = latest_complete_checkpoint(run)
    assert latest is not None
    assert latest.manifest is not None
    assert latest.manifest.signed


def test_the_key_comes_from_the_environment_and_a_short_one_is_refused_as_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CheckpointKey.from_env({}) is None
    assert CheckpointKey.from_env({CHECKPOINT_KEY_ENV: "  "}) is None
    with pytest.raises(SpotrayError, match="fewer than the 32") as short:
        CheckpointKey.from_env({CHECKPOINT_KEY_ENV: "secret"})
    assert cause_of(short.value) is Cause.BAD_INPUT
    monkeypatch.setenv(CHECKPOINT_KEY_ENV, "a" * 64)
    store = open_store(str(tmp_path / "bucket"))
    assert store.checkpoint_key == CheckpointKey(b"a" * 64)
    assert open_store(str(tmp_path / "bucket"), checkpoint_key=None).checkpoint_key is None
    assert "a" * 32 not in repr(store), "the key must never be printed"


def test_the_key_survives_the_trip_to_the_upload_process() -> None:
    """The upload process gets the store pickled: an S3 store dropped its key on the way (its state
    was written field by field), so every checkpoint went up unsigned and a keyed resume skipped all
    of them. Found on real pods: attempt 2 started from step 0."""
    config = StoreConfig(endpoint_url="http://127.0.0.1:9", access_key_id="a", secret_access_key="b")
    store = S3ObjectStore(parse_uri("s3://bucket/run"), config, checkpoint_key=KEY)
    assert pickle.loads(pickle.dumps(store)).checkpoint_key == KEY
    local = LocalObjectStore(parse_uri("/tmp/bucket"), checkpoint_key=KEY)
    assert pickle.loads(pickle.dumps(local)).checkpoint_key == KEY
