"""Run by test_node_copies.py under torchrun: three processes, each a node with its own directory,
copy their saves' files around the ring (train/checkpoints/node_copies.py), then write what each holds.

Rounds: step 10, every node offers files (one bigger than a chunk, one empty, one in a subfolder);
step 20, node 1 offers none (a save it skipped); step 30, node 2 leaves without taking part (its
process ends: a node lost) and the others' copying stops with a warning, training not disturbed.

python -m torch.distributed.run --standalone --nproc-per-node 3 tests/integration/node_copies_script.py OUT
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from spotray.train.checkpoints import node_copies
from spotray.train.checkpoints.node_copies import NodeCopies, PeerCopies, peer_group
from spotray.train.processes.ranks import destroy_process_group


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


if __name__ == "__main__":
    out = Path(sys.argv[1])
    node_copies.CHUNK_BYTES = 1 << 20  # the 2.5 MB file takes three chunks, as a real one takes many
    node_copies.TRANSFER_TIMEOUT = node_copies.timedelta(seconds=20)
    dist.init_process_group("gloo")
    node = dist.get_rank()
    copies = NodeCopies(out / f"node-{node}" / "copies", keep=2)
    group = peer_group((0, 1, 2))
    peers = PeerCopies(copies, group, (0, 1, 2), node)
    for step in (10, 20):
        peer_round = peers.open_round(step)
        offered = {} if (node, step) == (1, 20) else copies.keep_own(step, save(out, node, step))
        PeerCopies.offer(peer_round, offered)
    peers.close()
    held_after_20 = copies.held()
    dist.barrier()
    if node != 2:
        peers = PeerCopies(copies, group, (0, 1, 2), node)
        PeerCopies.offer(peers.open_round(30), copies.keep_own(30, save(out, node, 30)))
        peers.close()
    report = {"failed": repr(peers.failed), "held_after_20": held_after_20, "held": copies.held()}
    (out / f"node-{node}.json").write_text(json.dumps(report))
    if node == 2:
        sys.exit(0)  # leaves the others' copying without a neighbour
    destroy_process_group()
