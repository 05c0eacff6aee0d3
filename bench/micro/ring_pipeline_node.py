"""One node of bench/micro/ring_pipeline.py, run by torchrun: two processes stand for two nodes, each
with its own copies directory, and play rounds of the node-copies ring (train/checkpoints/node_copies.py)
with every setting of ``CHUNKS_IN_FLIGHT`` the bench names, in the order it names them.

Node 0 offers one file of ``size_mb`` MB (as a DDP run's node 0 holds the model and optimizer), node 1
one of 1 MB. Each round is timed from a barrier to both nodes' round done (the slower node's time);
rank 0 prints one JSON line per round: {"setting": ..., "seconds": ...}.

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/micro/ring_pipeline_node.py \
        WORK SIZE_MB SETTING[,SETTING...]
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.train.checkpoints import node_copies
from spotray.train.checkpoints.node_copies import NodeCopies, PeerCopies, ShareRecord, peer_group
from spotray.train.processes.ranks import destroy_process_group

MB = 1_000_000


def staged_source(work: Path, node: int, size_mb: int) -> Path:
    """The node's file, written once (random bytes, so no layer can shortcut them); each round links it."""
    source = work / f"source-{node}" / "model.safetensors"
    source.parent.mkdir(parents=True, exist_ok=True)
    with source.open("wb") as out:
        for _ in range(size_mb if node == 0 else 1):
            out.write(os.urandom(MB))
    return source


def stage(work: Path, source: Path, step: int) -> Path:
    staged = work / f"staged-{step}"
    staged.mkdir()
    (staged / source.name).hardlink_to(source)
    return staged


def main() -> None:
    work, size_mb, settings = Path(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
    dist.init_process_group("gloo")
    node = dist.get_rank()
    mine = work / f"node-{node}"
    source = staged_source(mine, node, size_mb)
    copies = NodeCopies(mine / "copies", keep=1)
    peers = PeerCopies(copies, peer_group((0, 1)), (0, 1), node)
    for step, setting in enumerate(settings, start=1):
        node_copies.CHUNKS_IN_FLIGHT = setting
        staged = stage(mine, source, step)
        dist.barrier()
        began = time.monotonic()
        round_ = peers.open_round(step)
        record = ShareRecord(step, f"save-{step}", node, 2, 2, "s3://bench/run")
        PeerCopies.offer(round_, copies.keep_own(step, staged), record)
        round_.done.wait()
        seconds = torch.tensor([time.monotonic() - began], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if not round_.copied:
            raise SystemExit(f"round {step} was not played whole: {peers.failed!r}")
        if node == 0:
            print(json.dumps({"setting": setting, "seconds": round(float(seconds[0]), 3)}), flush=True)
    peers.close()
    destroy_process_group()


if __name__ == "__main__":
    main()
