"""Run by test_node_copies.py under torchrun: three processes, each a node with its own directory,
copy their saves' files around the ring (train/checkpoints/node_copies.py), then write what each holds.

Rounds: step 10, every node offers files (one bigger than a chunk, one empty, one in a subfolder);
step 20, node 1 offers none (a save it skipped) and one byte of node 2's files flips on its way to
node 0 (which keeps the copy as it arrived, with node 2's record: its use, a completion here, refuses
it); step 30, node 2 leaves without taking part (its
process ends: a node lost) and the others' copying stops with a warning, training not disturbed.

python -m torch.distributed.run --standalone --nproc-per-node 3 tests/integration/node_copies_script.py OUT
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.contract.errors import CorruptCheckpointError
from spotray.train.checkpoints import node_copies
from spotray.train.checkpoints.complete_from_copies import Completion, upload_from_copies
from spotray.train.checkpoints.node_copies import NodeCopies, PeerCopies, ShareRecord, peer_group
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.storage.store import open_store


def payload(node: int, step: int, size: int) -> bytes:
    return bytes((node * 31 + step + i) % 251 for i in range(size))


def save(out: Path, node: int, step: int) -> Path:
    """What node ``node`` staged for the save of ``step``."""
    staged = out / f"staged-{node}-{step}"
    (staged / "sub").mkdir(parents=True)
    (staged / f"rng_state_{node}.pth").write_bytes(payload(node, step, 2_500_000 if node == 0 else 1000))
    (staged / f"empty_{node}").write_bytes(b"")
    (staged / "sub" / f"shard_{node}.bin").write_bytes(payload(node, step, 70_000))
    return staged


def record(node: int, step: int) -> ShareRecord:
    return ShareRecord(
        step, f"save-{step}", node, 3, 3, "s3://bucket/run", resume={"global_step": step} if node == 0 else {}
    )


def flip_a_byte_arriving_for(copies: NodeCopies, step: int) -> None:
    """The fault no real part makes on demand: one byte of a file arriving for ``step`` changes on the way."""
    receiving, write_from = copies.receiving, node_copies._FileStream.write_from
    arriving: list[int] = []

    def note_step(step_: int, name: str) -> Path:
        arriving[:] = [step_]
        return receiving(step_, name)

    def corrupt(stream: node_copies._FileStream, chunk: torch.Tensor) -> None:
        if arriving == [step] and len(chunk):
            chunk[0] ^= 1
        write_from(stream, chunk)

    copies.receiving = note_step  # type: ignore[method-assign]
    node_copies._FileStream.write_from = corrupt  # type: ignore[method-assign]


def records_held(copies: NodeCopies) -> dict[int, dict[int, dict[str, str]]]:
    found: dict[int, dict[int, dict[str, str]]] = {}
    for kept in copies.records():
        found.setdefault(kept.step, {})[kept.node] = {name: entry.sha256 for name, entry in kept.files.items()}
    return found


if __name__ == "__main__":
    out = Path(sys.argv[1])
    node_copies.CHUNK_BYTES = 1 << 20  # the 2.5 MB file takes three chunks, as a real one takes many
    node_copies.TRANSFER_TIMEOUT = node_copies.timedelta(seconds=20)
    dist.init_process_group("gloo")
    node = dist.get_rank()
    copies = NodeCopies(out / f"node-{node}" / "copies", keep=2)
    group = peer_group((0, 1, 2))
    peers = PeerCopies(copies, group, (0, 1, 2), node)
    if node == 0:
        flip_a_byte_arriving_for(copies, 20)
    for step in (10, 20):
        peer_round = peers.open_round(step)
        if (node, step) == (1, 20):
            PeerCopies.offer(peer_round, {})
        else:
            PeerCopies.offer(peer_round, copies.keep_own(step, save(out, node, step)), record(node, step))
    peers.close()
    held_after_20, records_after_20, failed_at_20 = copies.held(), records_held(copies), repr(peers.failed)
    completion_at_20 = "not tried"
    if node == 0:  # the copy of node 2's share that arrived with a byte flipped, used as a completion would
        [share] = [kept for kept in copies.records() if (kept.step, kept.node) == (20, 2)]
        plan = Completion(20, 3, share.files, {}, dict.fromkeys(share.files, 0))
        try:
            upload_from_copies(open_store(f"file://{out / 'store'}", checkpoint_key=None), plan, 0, copies)
            completion_at_20 = "uploaded"
        except CorruptCheckpointError as error:
            completion_at_20 = str(error)
    dist.barrier()
    if node != 2:
        peers = PeerCopies(copies, group, (0, 1, 2), node)
        PeerCopies.offer(peers.open_round(30), copies.keep_own(30, save(out, node, 30)), record(node, 30))
        peers.close()
    report = {
        "failed": repr(peers.failed), "held_after_20": held_after_20, "held": copies.held(),
        "records_after_20": records_after_20, "failed_at_20": failed_at_20, "records": records_held(copies),
        "completion_at_20": completion_at_20,
    }  # fmt: skip
    (out / f"node-{node}.json").write_text(json.dumps(report))
    if node == 2:
        sys.exit(0)  # leaves the others' copying without a neighbour
    destroy_process_group()
