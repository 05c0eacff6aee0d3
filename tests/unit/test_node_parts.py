"""Checkpoints saved by several nodes (train/checkpoints/node_parts.py): who uploads what, and when node 0 may commit.

The store is a directory; test_node_parts_s3.py runs the commit against SeaweedFS.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import CheckpointAbandonedError, CheckpointUploadError, CorruptCheckpointError
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    complete_checkpoints,
    download_checkpoint,
    list_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.node_parts import (
    NodeSave,
    part_key,
    plan_node_saves,
    upload_node_part,
    upload_shared_checkpoint,
)
from spotray.train.checkpoints.upload_worker import UploadJob
from spotray.train.checkpoints.uploader import newest_wins
from spotray.train.records.attempt_records import SupersededError, write_fence
from spotray.train.storage.store import LocalObjectStore, ObjectStore
from tests.conftest import write_files

pytestmark = [pytest.mark.unit, pytest.mark.core]

NODE_0 = {"model.safetensors": b"m" * 1000, "optimizer.pt": b"o" * 500, "rng_state_0.pth": b"r0"}
NODE_1 = {"rng_state_1.pth": b"r1", "pytorch_model_fsdp_0/__1_0.distcp": b"s1" * 100}


def store_at(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(parse_uri(str(tmp_path / "store")))


def shares(nodes: int = 2, save_id: str = "save-a") -> list[NodeSave]:
    return [NodeSave(node, nodes, save_id, tuple(sorted(NODE_1)) if node else ()) for node in range(nodes)]


def commit(store: ObjectStore, tmp_path: Path, share: NodeSave, step: int = 5, timeout_s: float = 10) -> None:
    staged = write_files(tmp_path / f"node-0-{step}", NODE_0)
    upload_shared_checkpoint(store, staged, step, 2, {"global_step": step}, share=share, parts_timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------ the plan


def test_one_node_with_two_processes_is_planned_as_one_upload_by_rank_0() -> None:
    planned = plan_node_saves([["model.safetensors", "rng_state_0.pth", "rng_state_1.pth"], None], "id")
    assert planned == [NodeSave(0, 1, "id"), None]


def test_each_file_goes_up_once_from_the_lowest_node_that_holds_it() -> None:
    own_disks = plan_node_saves([["model.safetensors", "rng_state_0.pth"], None, ["rng_state_2.pth"], None], "id")
    assert own_disks == [NodeSave(0, 2, "id"), None, NodeSave(1, 2, "id", ("rng_state_2.pth",)), None]
    each_node = plan_node_saves(
        [["model.safetensors", "rng_state_0.pth"], ["model.safetensors", "rng_state_1.pth"]], "i"
    )
    assert each_node[1] == NodeSave(1, 2, "i", ("rng_state_1.pth",))
    shared_nfs = plan_node_saves([["a", "rng_state_0.pth", "rng_state_1.pth"]] * 2, "i")
    assert shared_nfs[1] == NodeSave(1, 2, "i", ())


def test_rank_0_must_lead_its_node() -> None:
    with pytest.raises(ValueError, match="rank 0"):
        plan_node_saves([None, ["model.safetensors"]], "id")


# ------------------------------------------------------------------------------------------ the commit


def test_the_manifest_covers_every_nodes_files_and_a_download_gets_them_all(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    upload_node_part(store, write_files(tmp_path / "node-1", NODE_1), 5, node_1)
    assert not complete_checkpoints(store)  # a part alone is not a checkpoint
    commit(store, tmp_path, node_0)
    [info] = complete_checkpoints(store)
    assert info.manifest is not None
    assert set(info.manifest.files) == set(NODE_0) | set(NODE_1)
    assert info.manifest.resume == {"global_step": 5}
    local = download_checkpoint(store, info, tmp_path / "resume")
    for name, data in {**NODE_0, **NODE_1}.items():
        assert (local / name).read_bytes() == data


def test_node_0_waits_for_a_part_written_after_its_own_files(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    write_files(tmp_path / "node-1", NODE_1)
    original_upload = store.upload_files
    calls = []

    def upload_then_node_1_finishes(pairs: list[tuple[Path, str]]) -> None:
        original_upload(pairs)
        if not calls:  # node 0's own files are up: node 1 delivers its part only now
            calls.append(1)
            upload_node_part(store, tmp_path / "node-1", 5, node_1)

    store.upload_files = upload_then_node_1_finishes  # type: ignore[method-assign]
    commit(store, tmp_path, node_0)
    assert [c.step for c in complete_checkpoints(store)] == [5]


def test_a_part_of_another_save_is_not_counted_and_the_missing_node_is_named(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, _ = shares(save_id="this-save")
    _, older = shares(save_id="an-older-attempts-save")
    upload_node_part(store, write_files(tmp_path / "node-1", NODE_1), 5, older)
    reads: list[str] = []
    original_get = store.get_bytes

    def counted_get(key: str, *, max_bytes: int | None = None) -> bytes:
        reads.append(key)
        return original_get(key, max_bytes=max_bytes)

    store.get_bytes = counted_get  # type: ignore[method-assign]
    with pytest.raises(CheckpointUploadError, match=r"node\(s\) 1 did not upload their part in time"):
        commit(store, tmp_path, node_0, timeout_s=0.5)
    assert reads.count(part_key(5, 1)) == 1  # polled by listing: the unchanged stale part is read once
    assert [c.problem for c in list_checkpoints(store)] == ["no manifest (upload unfinished or interrupted)"]


def test_a_node_that_dropped_its_part_makes_node_0_abandon_the_checkpoint(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    upload_node_part(store, tmp_path, 5, NodeSave(1, 2, node_1.save_id, node_1.files, dropped=True))
    with pytest.raises(CheckpointAbandonedError, match="node 1 dropped its part"):
        commit(store, tmp_path, node_0, timeout_s=30)  # at once: no waiting for the deadline
    assert not complete_checkpoints(store)


def test_two_nodes_uploading_one_name_with_different_bytes_never_commit(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    clash = {"model.safetensors": b"n" * 1000}
    upload_node_part(
        store, write_files(tmp_path / "node-1", clash), 5, NodeSave(1, 2, node_1.save_id, ("model.safetensors",))
    )
    with pytest.raises(CheckpointUploadError, match=r"nodes 0 and 1 uploaded different bytes as model\.safetensors"):
        commit(store, tmp_path, node_0)
    assert not complete_checkpoints(store)


def test_a_file_gone_from_the_store_after_its_part_was_written_is_caught_before_the_manifest(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    upload_node_part(store, write_files(tmp_path / "node-1", NODE_1), 5, node_1)
    store.delete(["checkpoint-5/rng_state_1.pth"])
    with pytest.raises(CheckpointUploadError, match=r"rng_state_1\.pth is not in the store"):
        commit(store, tmp_path, node_0)
    assert not complete_checkpoints(store)


def test_a_node_replacing_an_earlier_checkpoint_of_its_step_retracts_its_manifest_first(tmp_path: Path) -> None:
    """An older attempt's complete checkpoint-5 must not stay complete while its files are replaced."""
    store = store_at(tmp_path)
    upload_checkpoint(store, write_files(tmp_path / "old", {**NODE_0, "rng_state_1.pth": b"old"}), 5, 2)
    assert [c.step for c in complete_checkpoints(store)] == [5]
    _, node_1 = shares()
    upload_node_part(store, write_files(tmp_path / "node-1", {"rng_state_1.pth": b"new"}), 5, node_1)
    assert not (store.root / "checkpoint-5" / MANIFEST_NAME).exists()


def test_a_superseded_attempt_writes_no_part(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    old, new = AttemptId("run", 1), AttemptId("run", 2)
    write_fence(store, new)
    _, node_1 = shares()
    with pytest.raises(SupersededError):
        upload_node_part(store, write_files(tmp_path / "node-1", NODE_1), 5, node_1, attempt=old)
    assert not (store.root / part_key(5, 1)).exists()


@pytest.mark.parametrize(
    "record",
    [
        b"not json",
        json.dumps(
            {"node": 1, "save_id": "save-a", "dropped": False, "files": {"../../escape": {"size": 1, "sha256": "x"}}}
        ).encode(),
    ],
)
def test_a_hostile_part_is_refused_and_the_checkpoint_not_completed(tmp_path: Path, record: bytes) -> None:
    store = store_at(tmp_path)
    node_0, _ = shares()
    store.put_bytes(part_key(5, 1), record)
    with pytest.raises(CorruptCheckpointError, match="node part"):
        commit(store, tmp_path, node_0)
    assert not complete_checkpoints(store)


# ------------------------------------------------------------------------------------ newest wins


def job(step: int, share: NodeSave | None) -> UploadJob:
    return UploadJob(Path(f"/staging/checkpoint-{step}"), step, 2, {}, None, share)


def test_a_dropped_part_leaves_a_notice_for_node_0_and_notices_are_never_dropped() -> None:
    _, node_1 = shares()
    notices, dropped = newest_wins([job(4, node_1)])
    assert [j.step for j in dropped] == [4]
    assert [(j.step, j.share.dropped if j.share else None) for j in notices] == [(4, True)]
    notices_again, dropped_again = newest_wins([*notices, job(6, node_1)])
    assert [j.step for j in dropped_again] == [6]
    assert [j.step for j in notices_again] == [4, 6]
    node_0_notices, node_0_dropped = newest_wins([job(4, shares()[0]), job(5, None)])
    assert (node_0_notices, [j.step for j in node_0_dropped]) == ([], [4, 5])


def test_the_manifest_lists_sha256_of_each_nodes_bytes(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    node_0, node_1 = shares()
    upload_node_part(store, write_files(tmp_path / "node-1", NODE_1), 5, node_1)
    commit(store, tmp_path, node_0)
    [info] = complete_checkpoints(store)
    assert info.manifest is not None
    for name, data in {**NODE_0, **NODE_1}.items():
        assert info.manifest.files[name].sha256 == hashlib.sha256(data).hexdigest()
