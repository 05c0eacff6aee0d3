"""Which node reads which bytes of a checkpoint from S3 on a resume across nodes (train/checkpoints/shared_read.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import CheckpointInfo, FileEntry, Manifest
from spotray.train.checkpoints.shared_read import assign_pieces, layout_from_places
from spotray.train.storage.hashed_download import RangeToFetch
from spotray.train.storage.store import LocalObjectStore

pytestmark = pytest.mark.unit


def entries(**sizes: int) -> dict[str, FileEntry]:
    return {name.replace("_", "."): FileEntry(size, "0" * 64) for name, size in sizes.items()}


def test_the_ranks_of_one_directory_on_one_host_are_one_node_numbered_by_their_lowest_rank() -> None:
    places = [("host-b", "/w/resume"), ("host-b", "/w/resume"), ("host-a", "/w/resume"), ("host-a", "/w/resume")]
    layout = layout_from_places(places, rank=3)
    assert layout.node_of_rank == (0, 0, 1, 1)
    assert (layout.nodes, layout.node, layout.leaders, layout.is_leader) == (2, 1, (0, 2), False)
    # Two directories on one host (the tests' stand-in for two machines) are two nodes.
    local = layout_from_places([("h", "/a"), ("h", "/b"), ("h", "/a")], rank=2)
    assert local.node_of_rank == (0, 1, 0)
    assert local.leaders == (0, 1)


def test_every_byte_is_in_one_piece_in_file_order() -> None:
    files = entries(optimizer_pt=250, model_safetensors=120, rng_0=10, empty=0)
    pieces = assign_pieces(files, nodes=3, piece_bytes=100)
    assert [(p.name, p.offset, p.length) for p in pieces] == [
        ("model.safetensors", 0, 100),
        ("model.safetensors", 100, 20),
        ("optimizer.pt", 0, 100),
        ("optimizer.pt", 100, 100),
        ("optimizer.pt", 200, 50),
        ("rng.0", 0, 10),
    ]  # an empty file has no piece: every node makes it


def test_one_large_file_is_read_by_every_node_not_by_one() -> None:
    """The optimizer's state is most of a checkpoint: cut into pieces, no node reads much more than a
    fair share, whatever the sizes."""
    files = entries(optimizer_pt=9_000, model_safetensors=4_500, rng_0=10, rng_1=10, state_json=2)
    pieces = assign_pieces(files, nodes=4, piece_bytes=500)
    load = [sum(p.length for p in pieces if p.node == node) for node in range(4)]
    assert sum(load) == sum(entry.size for entry in files.values())
    assert max(load) - min(load) <= 500
    assert {p.node for p in pieces if p.name == "optimizer.pt"} == {0, 1, 2, 3}


def test_every_leader_computes_the_same_pieces_whatever_order_the_manifest_lists_them_in() -> None:
    files = entries(a=5, b=5, c=5, d=1)
    backwards = dict(reversed(list(files.items())))
    assert assign_pieces(files, nodes=2, piece_bytes=3) == assign_pieces(backwards, nodes=2, piece_bytes=3)


def test_one_node_reads_everything() -> None:
    assert {p.node for p in assign_pieces(entries(a=5, b=7), nodes=1, piece_bytes=2)} == {0}


def test_a_directory_store_writes_each_range_where_it_belongs(tmp_path: Path) -> None:
    """A checkpoint URI on a mounted volume (file://) reads shares too: each range at its offset, the
    rest of the file left as it was; a range past the object's end is an error, not a short file."""
    store = LocalObjectStore(parse_uri(str(tmp_path / "bucket")))
    data = bytes(range(256)) * 40
    store.put_bytes("checkpoint-5/optimizer.pt", data)
    local = tmp_path / "node" / "optimizer.pt"
    local.parent.mkdir()
    local.write_bytes(b"\0" * len(data))
    store.download_ranges([RangeToFetch("checkpoint-5/optimizer.pt", local, 1000, 3000)])
    got = local.read_bytes()
    assert got[1000:4000] == data[1000:4000]
    assert got[:1000] == b"\0" * 1000
    assert got[4000:] == b"\0" * (len(data) - 4000)
    with pytest.raises(FileNotFoundError, match="shorter than its range"):
        store.download_ranges([RangeToFetch("checkpoint-5/optimizer.pt", local, len(data) - 10, 20)])


def test_a_file_a_node_kept_is_read_from_its_copies_by_the_nodes_that_hold_it_and_no_other() -> None:
    files = entries(optimizer_pt=250, model_safetensors=120, rng_0=10, rng_1=10)
    pieces = assign_pieces(files, nodes=3, piece_bytes=100, holders={"optimizer.pt": [1, 2], "rng.0": [0]})
    by_file: dict[str, set[tuple[int, bool]]] = {}
    for piece in pieces:
        by_file.setdefault(piece.name, set()).add((piece.node, piece.kept))
    assert {node for node, _ in by_file["optimizer.pt"]} == {1, 2}, "the holders share the big file"
    assert by_file["rng.0"] == {(0, True)}
    assert all(not kept for _, kept in by_file["model.safetensors"] | by_file["rng.1"]), "held by nobody: S3"
    # No holders at all (an empty list) is the same as S3 for that file.
    assert all(not p.kept for p in assign_pieces(files, nodes=2, piece_bytes=100, holders={"rng.1": []}))


def test_a_node_holds_a_file_only_at_the_size_the_manifest_gives_it() -> None:
    manifest = Manifest(7, 2, entries(model_safetensors=120, rng_0=10), 0.0)
    info = CheckpointInfo(7, "checkpoint-7", 130, manifest, None)
    held = [{7: {"model.safetensors": 120, "rng.0": 9}}, {7: {"rng.0": 10}, 6: {"model.safetensors": 120}}]
    layout = layout_from_places([("h", "/a"), ("h", "/a"), ("h", "/b")], rank=0, held=[*held[:1], {}, held[1]])
    assert layout.holders(info) == {"model.safetensors": [0], "rng.0": [1]}
