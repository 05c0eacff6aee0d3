"""Releasing streaming's shared memory by owner: only the prefixes registered for our cache directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from spotray.train.hf.data import streaming_sees_machines
from spotray.train.hf.streaming_memory import LOCK_NAMES, SEGMENT_NAMES, parse_locals, release_streaming_memory
from spotray.train.processes.ranks import MachineRanks

pytestmark = pytest.mark.unit


def locals_segment(dirs: list[str], prefix: int) -> bytes:
    """The layout streaming writes (streaming.base.shared.prefix._pack_locals)."""
    data = ("\0".join(dirs) + f"\0{prefix}").encode()
    return (4 + len(data)).to_bytes(4, sys.byteorder, signed=True) + data


def register(shm: Path, locks: Path, prefix: int, dirs: list[str]) -> None:
    (shm / f"{prefix:06}_locals").write_bytes(locals_segment(dirs, prefix))
    for name in SEGMENT_NAMES[1:]:
        (shm / f"{prefix:06}_{name}").write_bytes(b"\0" * 8)
    for name in LOCK_NAMES:
        (locks / f"{prefix:06}_{name}").touch()


def test_only_the_prefixes_of_our_cache_directory_are_released(tmp_path: Path) -> None:
    shm, locks = tmp_path / "shm", tmp_path / "locks"
    shm.mkdir()
    locks.mkdir()
    ours, theirs = tmp_path / "run-a" / "mds-cache", tmp_path / "run-b" / "mds-cache"
    register(shm, locks, 3, [str(ours)])
    register(shm, locks, 4, [str(theirs)])
    register(shm, locks, 9, [str(ours / "train")])  # a split below our cache directory
    register(shm, locks, 10, [str(ours) + "-other"])  # a sibling whose name starts like ours
    (shm / "psm_unrelated").write_bytes(b"x")

    assert release_streaming_memory(ours, shm_dir=shm, lock_dir=locks) == [3, 9]

    left = sorted(path.name for path in shm.iterdir())
    assert not [name for name in left if name.startswith(("000003_", "000009_"))]
    assert {"000004_locals", "000010_epoch_data", "psm_unrelated"} <= set(left)
    assert sorted(path.name for path in locks.iterdir()) == [f"{p:06}_{n}" for p in (4, 10) for n in sorted(LOCK_NAMES)]
    assert release_streaming_memory(ours, shm_dir=shm, lock_dir=locks) == [], "nothing left to release"


def test_a_missing_shared_memory_directory_releases_nothing(tmp_path: Path) -> None:
    assert release_streaming_memory(tmp_path / "cache", shm_dir=tmp_path / "no-shm", lock_dir=tmp_path) == []


@pytest.mark.parametrize("data", [b"", b"\x01", b"\xff\xff\xff\x7f/a\0/b\x000", b"\x00\x00\x00\x00garbage"])
def test_a_malformed_locals_segment_is_read_without_error(data: bytes) -> None:
    assert isinstance(parse_locals(data), tuple)


def test_names_match_the_installed_streaming() -> None:
    constant = pytest.importorskip("streaming.base.constant")
    assert tuple(constant.SHM_TO_CLEAN) == SEGMENT_NAMES
    assert (constant.BARRIER_FILELOCK, constant.CACHE_FILELOCK) == LOCK_NAMES
    prefix = pytest.importorskip("streaming.base.shared.prefix")
    packed = prefix._pack_locals(["/a/cache", "/b"], 12)
    assert parse_locals(packed) == ("/a/cache", "/b")
    assert locals_segment(["/a/cache", "/b"], 12) == packed


def test_streaming_counts_the_machines_ranks_only_where_two_nodes_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Ray nodes on one machine (local mode's elastic test) would both be streaming's local leader."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with streaming_sees_machines(MachineRanks(local_rank=1, local_world_size=2, uniform=True)):
        assert (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("0", "1"), "restored for torch and HF"

    with streaming_sees_machines(MachineRanks(local_rank=0, local_world_size=1, uniform=True)):
        assert (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("0", "1")  # one node a machine
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with streaming_sees_machines(MachineRanks(local_rank=1, local_world_size=3, uniform=False)):
        assert "LOCAL_WORLD_SIZE" not in os.environ, "machines of unequal sizes are left to the launcher"
