"""What a node keeps of its saves (train/checkpoints/node_copies.py): hard links, the newest steps, and
nothing half received."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.train.checkpoints.checkpoint import FileEntry
from spotray.train.checkpoints.node_copies import NodeCopies, ShareRecord, copies_hold_the_save

pytestmark = pytest.mark.unit


def staged(tmp_path: Path, step: int, **files: bytes) -> Path:
    directory = tmp_path / f"staged-{step}"
    for name, data in files.items():
        path = directory / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def test_a_node_keeps_its_staged_files_as_links_not_copies(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies")
    source = staged(tmp_path, 5, model=b"m" * 10, sub__shard=b"s")
    kept = copies.keep_own(5, source)
    assert sorted(kept) == ["model", "sub/shard"]
    assert kept["model"].stat().st_ino == (source / "model").stat().st_ino
    assert copies.held() == {5: {"model": 10, "sub/shard": 1}}


def test_only_the_newest_steps_are_kept(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies", keep=2)
    for step in (10, 30, 20):
        copies.keep_own(step, staged(tmp_path, step, model=b"x"))
    assert sorted(copies.held()) == [20, 30]


def test_a_file_still_arriving_is_not_held_and_a_stale_arrival_is_dropped(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies", keep=1)
    copies.keep_own(20, staged(tmp_path, 20, model=b"x"))
    copies.receiving(30, "rng_state_1.pth").write_bytes(b"half")
    assert copies.held() == {20: {"model": 1}}, "half received: not held"
    copies.received(30, ["rng_state_1.pth"])
    assert copies.held() == {30: {"rng_state_1.pth": 4}}, "the newer step took the one place"
    copies.receiving(10, "rng_state_1.pth").write_bytes(b"late")
    copies.received(10, ["rng_state_1.pth"])
    assert copies.held() == {30: {"rng_state_1.pth": 4}}, "older than what is kept: dropped"
    assert not any((tmp_path / "copies" / ".incoming").iterdir())


def test_a_name_another_node_sends_must_stay_inside_the_copies(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="\\.\\."):
        NodeCopies(tmp_path / "copies").receiving(3, "../../etc/passwd")


def test_a_step_waiting_to_be_sent_survives_the_prune_of_a_newer_save(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies", keep=1)
    copies.keep_own(10, staged(tmp_path, 10, model=b"x"))
    copies.sending.add(10)
    copies.keep_own(20, staged(tmp_path, 20, model=b"y"))
    assert sorted(copies.held()) == [10, 20], "10 is still to be sent to the next node"
    copies.sending.discard(10)
    copies.prune()
    assert sorted(copies.held()) == [20]


@pytest.mark.parametrize(
    ("reports", "held", "why"),
    [
        ([(0, True, False), (1, True, True)], True, "node 1 goes; its files are on node 0, node 0's on itself"),
        ([(1, True, True), (0, True, False)], True, "reported in any order: the ring places decide"),
        ([(0, True, False), (1, True, True), (2, True, False)], True, "node 1's successor, 2, stays"),
        ([(0, True, True), (1, True, False), (2, True, True), (3, True, False)], True, "0 and 2 go, 1 and 3 stay"),
        ([(0, True, True), (1, True, False), (2, True, True)], False, "2 goes and its successor, 0, too"),
        ([(0, True, False), (1, True, True), (2, True, True)], False, "1 goes and so does 2, which holds its copy"),
        ([(0, True, False), (1, False, True)], False, "node 1's round was not played whole: its copy may be partial"),
        ([(0, False, False), (1, True, True)], False, "node 0's round failed: it may not hold node 1's files"),
        ([(0, True, True), (1, True, True)], False, "every node goes"),
        ([(0, True, False), (1, True, False)], False, "none goes: nothing says which node the notice takes"),
        ([(0, True, False), (None, False, True)], False, "a node with no ring place keeps no copies"),
        ([(0, True, True)], False, "one node: no ring"),
        ([(0, True, False), (2, True, True)], False, "places that are not a ring of 0..n-1"),
    ],
)
def test_an_emergency_checkpoint_is_held_without_the_store_only_when_every_file_stays_on_a_node_that_stays(
    reports: list[tuple[int | None, bool, bool]], held: bool, why: str
) -> None:
    assert copies_hold_the_save(reports) is held, why


def test_a_step_counted_safe_only_in_the_copies_survives_the_prune_of_newer_saves(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies", keep=1)
    copies.keep_own(5, staged(tmp_path, 5, model=b"x"))
    copies.pinned.add(5)  # an emergency checkpoint safe in the copies, its upload not over
    for step in (6, 9):
        copies.keep_own(step, staged(tmp_path, step, model=b"y"))
    assert sorted(copies.held()) == [5, 9]


def test_a_checkpoint_whose_round_is_over_stays_until_the_next_ones_round_is_over(tmp_path: Path) -> None:
    """keep=1 keeps the newest checkpoint the node holds whole with its records, not the newest it has begun:
    a node that kept its own share of checkpoint-6 and died before 6's round was over still holds 3."""
    copies = NodeCopies(tmp_path / "copies", keep=1)
    copies.keep_own(3, staged(tmp_path, 3, model=b"x"))
    copies.keep_record(ShareRecord(3, "a", 0, 2, 2, "s3://b/r", {"model": FileEntry(1, "h")}))  # 3's round over
    copies.keep_own(6, staged(tmp_path, 6, model=b"y"))  # 6's round begun, not over
    assert sorted(copies.held()) == [3, 6], "checkpoint-3 pruned before checkpoint-6 was whole here"
    copies.keep_record(ShareRecord(6, "b", 0, 2, 2, "s3://b/r", {"model": FileEntry(1, "h")}))
    copies.prune()  # as the end of 6's round does
    assert sorted(copies.held()) == [6]
    for step in (9, 12, 15):  # the ring stopped: no round is over any more, and the disk stays bounded
        copies.keep_own(step, staged(tmp_path, step, model=b"z"))
    assert sorted(copies.held()) == [6, 15]
