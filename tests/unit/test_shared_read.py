"""Which node reads which file of a checkpoint from S3 on a resume across nodes (train/checkpoints/shared_read.py)."""

from __future__ import annotations

import pytest

from spotray.train.checkpoints.checkpoint import FileEntry
from spotray.train.checkpoints.shared_read import assign_files, layout_from_places

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


def test_the_files_are_spread_so_that_no_node_reads_much_more_than_its_share() -> None:
    files = entries(optimizer_pt=900, model_safetensors=450, rng_0=10, rng_1=10, state_json=2, empty=0)
    owners = assign_files(files, nodes=3)
    load = [sum(files[name].size for name, node in owners.items() if node == k) for k in range(3)]
    assert sorted(owners) == sorted(files)
    assert load[owners["optimizer.pt"]] == 900  # the largest file alone: it cannot be split between nodes
    assert max(load) - min(load) <= 900
    assert sum(load) == sum(entry.size for entry in files.values())


def test_every_leader_computes_the_same_shares_whatever_order_the_manifest_lists_them_in() -> None:
    files = entries(a=5, b=5, c=5, d=1)
    backwards = dict(reversed(list(files.items())))
    assert assign_files(files, nodes=2) == assign_files(backwards, nodes=2)
    assert set(assign_files(files, nodes=2).values()) == {0, 1}


def test_one_node_reads_everything() -> None:
    files = entries(a=5, b=7)
    assert assign_files(files, nodes=1) == {"a": 0, "b": 0}
