"""Which save the nodes can complete in the store from their copies (train/checkpoints/complete_from_copies.py),
and the records the copies keep for it (train/checkpoints/node_copies.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.train.checkpoints.checkpoint import NO_MANIFEST, CheckpointInfo, FileEntry
from spotray.train.checkpoints.complete_from_copies import plan_completion
from spotray.train.checkpoints.node_copies import NodeCopies, ShareRecord

pytestmark = pytest.mark.unit

URI = "s3://bucket/run"


def share(node: int, step: int = 30, save_id: str = "a", nodes: int = 2, uri: str = URI) -> ShareRecord:
    files = {"model.safetensors": FileEntry(100, "m"), "rng_state_0.pth": FileEntry(5, "r0")} if node == 0 else {}
    files |= {f"rng_state_{node}.pth": FileEntry(5, f"r{node}")} if node else {}
    resume = {"global_step": step, "data_position": {"epoch": 0}} if node == 0 else {}
    return ShareRecord(step, save_id, node, nodes, 4, uri, files, resume)


def sizes(*records: ShareRecord) -> dict[int, dict[str, int]]:
    held: dict[int, dict[str, int]] = {}
    for record in records:
        held.setdefault(record.step, {}).update({name: entry.size for name, entry in record.files.items()})
    return held


def listed(step: int, complete: bool = True, problem: str = NO_MANIFEST) -> CheckpointInfo:
    return CheckpointInfo(step, f"checkpoint-{step}", 1, None, None if complete else problem)


def test_the_newest_save_every_share_of_which_a_node_holds_is_completed_by_its_lowest_holders() -> None:
    # Node 0 was lost and replaced: the new node 0 holds nothing; node 1 holds both shares (its own and
    # the ring copy of node 0's); the store's newest complete is 20 and 30's upload never finished.
    records = [(), (share(0), share(1))]
    held = [{}, sizes(share(0), share(1))]
    plan = plan_completion(records, held, URI, [listed(30, complete=False), listed(20)])
    assert plan is not None
    assert (plan.step, plan.world_size, plan.resume["global_step"]) == (30, 4, 30)
    assert plan.files == share(0).files | share(1).files
    assert plan.files_of(0) == []
    assert plan.files_of(1) == sorted(plan.files)
    both = plan_completion([(share(0),), (share(0), share(1))], [sizes(share(0)), held[1]], URI, [listed(20)])
    assert both is not None
    assert both.uploader_of == {"model.safetensors": 0, "rng_state_0.pth": 0, "rng_state_1.pth": 1}


@pytest.mark.parametrize(
    ("records", "store", "why"),
    [
        ([(share(0),), ()], [listed(20)], "node 1's share is lost with node 1 and its ring copy"),
        ([(share(0), share(1))], [listed(30)], "the store has it complete already"),
        ([(share(0), share(1))], [listed(40)], "the store has a newer one"),
        ([(share(0), share(1))], [listed(30, False, "its manifest is corrupt"), listed(20)], "a manifest is there"),
        ([(share(0), share(1, save_id="b"))], [listed(20)], "the shares are of two saves of step 30"),
        ([(share(0, uri="s3://other"), share(1, uri="s3://other"))], [listed(20)], "another URI's save"),
        ([(share(0, nodes=3), share(1, nodes=3))], [listed(20)], "a save of three nodes, one share missing"),
    ],
)
def test_nothing_is_completed_unless_the_nodes_hold_every_share_of_a_save_newer_than_the_store(
    records: list[tuple[ShareRecord, ...]], store: list[CheckpointInfo], why: str
) -> None:
    held = [sizes(*node_records) for node_records in records]
    assert plan_completion(records, held, URI, store) is None, why


def test_a_record_whose_files_are_not_held_at_their_size_is_not_a_plan() -> None:
    held = [sizes(share(0), share(1))]
    held[0][30]["model.safetensors"] = 99
    assert plan_completion([(share(0), share(1))], held, URI, [listed(20)]) is None
    older = [(share(0, step=20), share(1, step=20), share(0), share(1))]
    held_older = [sizes(*older[0])]
    held_older[0][30]["model.safetensors"] = 99
    plan = plan_completion(older, held_older, URI, [listed(10)])
    assert plan is not None
    assert plan.step == 20, "an older save the nodes hold whole still beats the store's"


def test_a_record_is_kept_beside_its_files_and_read_back_only_while_they_are_whole(tmp_path: Path) -> None:
    copies = NodeCopies(tmp_path / "copies", keep=1)
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "rng_state_1.pth").write_bytes(b"12345")
    copies.keep_own(30, staged)
    copies.keep_record(share(1))
    assert copies.records() == [share(1)]
    assert ShareRecord.from_json(share(0).to_json(), "here") == share(0)
    (copies.path_of(30, "rng_state_1.pth")).write_bytes(b"123")
    assert copies.records() == [], "a file shorter than its record: the record names no whole share"
    copies.keep_own(30, staged)
    assert copies.records() == [], "a new save of the step: the old save's records go"
    copies.keep_record(share(1))
    (tmp_path / "copies" / ".records" / "checkpoint-30" / "node-1.json").write_text('{"step": 30}')
    assert copies.records() == [], "a record that cannot be read is passed over"
    copies.keep_own(40, staged)
    assert not (tmp_path / "copies" / ".records" / "checkpoint-30").exists(), "pruned with its step"


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd"])
def test_a_record_naming_a_file_outside_the_checkpoint_is_refused(name: str) -> None:
    record = ShareRecord(30, "a", 0, 1, 1, URI, {name: FileEntry(1, "x")})
    with pytest.raises(Exception, match=r"escape|passwd|absolute|outside"):
        ShareRecord.from_json(record.to_json(), "here")
