"""Read once per run (issue 73, item 1): on a resume across several nodes, each file of the checkpoint
is read from S3 by one node and reaches the others from that node, verified against the manifest.
Against a real SeaweedFS, with torchrun processes (gloo) standing for the nodes, each node its own
directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from spotray.train.checkpoints.checkpoint import upload_checkpoint
from spotray.train.storage.store import S3ObjectStore
from tests.conftest import run_ranks, write_files

pytestmark = [pytest.mark.integration, pytest.mark.core]

SCRIPT = Path(__file__).with_name("read_once_script.py")


def plant(store: S3ObjectStore, root: Path, step: int) -> dict[str, bytes]:
    """A checkpoint of files of different sizes (some larger than one download part), uploaded whole."""
    files = {
        "model.safetensors": os.urandom(5 << 20),
        "optimizer.pt": os.urandom(9 << 20),
        "rng_state_0.pth": os.urandom(14_000),
        "trainer_state.json": b'{"global_step": %d}' % step,
        "empty.txt": b"",
    }
    upload_checkpoint(store, write_files(root / f"src-{step}", files), step, world_size=1)
    return files


@pytest.mark.parametrize("layout", ["4x1", "2x2"])
def test_a_resume_on_several_nodes_reads_each_byte_from_s3_once(
    s3_store: S3ObjectStore, s3_env: dict[str, str], tmp_path: Path, layout: str
) -> None:
    """Four processes resume from the newest checkpoint. Every node ends with a copy of every file, each
    byte-for-byte the one uploaded; the bytes read from S3 by all of them together are the checkpoint's
    size, not once per node. Resumed again on the same nodes (workers restarted), they read nothing."""
    plant(s3_store, tmp_path, 10)
    files = plant(s3_store, tmp_path, 20)
    ended = resume_on_four(s3_store, s3_env, tmp_path, layout)
    check_copies(ended, files)
    size = sum(len(data) for data in files.values())
    # Counted: the files' ranged reads (manifests are read whole, apart).
    first, second = (sum(result["read_bytes"][i] for result in ended) for i in (0, 1))
    assert first == size, f"read {first} bytes of files from S3 for a checkpoint of {size}: {first / size:.2f}x"
    assert second == first, "a node that holds a verified copy read from S3 again"


def test_a_piece_that_reaches_the_nodes_wrong_makes_every_node_read_the_checkpoint_whole(
    s3_store: S3ObjectStore, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """Node 1 sends a wrong byte in each piece it read: the files they are in do not match the manifest
    on any node, and nobody can tell which piece was wrong, so no copy of the exchange is used; every
    node reads the checkpoint whole from S3, as on one node, and each copy is the one uploaded."""
    files = plant(s3_store, tmp_path, 20)
    ended = resume_on_four(s3_store, s3_env, tmp_path, "4x1", bad_peer=1)
    check_copies(ended, files)
    size = sum(len(data) for data in files.values())
    assert sum(result["read_bytes"][0] for result in ended) == size + 4 * size  # the shares, then 4 whole reads


def resume_on_four(
    store: S3ObjectStore, env: dict[str, str], tmp_path: Path, layout: str, bad_peer: int | None = None
) -> list[dict[str, Any]]:
    out = tmp_path / "out"
    out.mkdir()
    if bad_peer is not None:
        env = {**env, "BAD_PEER": str(bad_peer)}
    run_ranks(SCRIPT, [str(store.uri), str(out), layout], env, processes=4)
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]


def check_copies(ended: list[dict[str, Any]], files: dict[str, bytes]) -> None:
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    for result in ended:
        assert result["step"] == 20, result
        assert {name: result["files"].get(name) for name in expected} == expected
