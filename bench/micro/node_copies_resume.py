"""A resume on four nodes: from the copies the nodes kept of their saves (A) against from S3, read once (B).

Issue 73, item 2: each node keeps its files of the newest checkpoint and sends them to the next node
while they upload (train/checkpoints/node_copies.py). After a node is lost and replaced, the others
still hold every file, and a resume reads them from there instead of from S3.

Set up as bench/micro/read_once.py (four torchrun processes as four nodes, each through its own
proxy limited to ``--node-mb-s`` MB/s, one SeaweedFS, a checkpoint of ``--size-mb`` shaped like a
Hugging Face one). The copies are what the ring leaves after the save, with node 0 (which held the
model and the optimizer, as DDP's rank 0 does) lost and replaced by an empty node: node 1 holds node
0's files and its own RNG state, node 2 its own and node 1's, node 3 its own and node 2's (hard links
to one set of files: the disk holds one copy). For ``--rounds`` rounds, A and B back to back, the
order flipping every round, the nodes' resume directories emptied before each leg:

- A: ``ResumeFetch`` with each node's copies: node 1 sends the large files to every node, no S3 read;
- B: ``ResumeFetch`` without them: each node reads a quarter from S3, then the nodes exchange.

Each leg is timed from a barrier after start-up to a barrier once every node holds its verified
copy. Figures: ratio = median of each round's A seconds / B seconds; goal <= 0.3, the issue's goal
for a resume from a peer's memory against one from S3, fixed before the first run (this figure is
the read, not notice to first step). And S3 bytes per resume / checkpoint size (A: 0).

    .venv/bin/python -m bench.micro.node_copies_resume [--rounds 3] [--size-mb 2048] [--node-mb-s 150]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.campaigns.fault_proxy import FaultProxy
from bench.common import ROOT, machine_details, paired_ratio, scratch_dir, write_result
from bench.micro.read_once import BUCKET, MB, NODES, earlier_runs, plant_checkpoint, run_leg
from spotray.contract.uris import parse_uri
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore

GOAL = "<= 0.3"


def plant_copies(source: Path, copies: Path) -> dict[int, list[str]]:
    """What the ring leaves after node 0 is replaced: node k (1-3) holds its RNG state and node k-1's
    files (node 0's: all but the other RNG states). Hard links; returns each node's names."""
    names = sorted(p.name for p in source.iterdir())
    own = {node: [n for n in names if n == f"rng_state_{node}.pth"] for node in range(1, NODES)}
    own[0] = [n for n in names if not n.startswith("rng_state_") or n == "rng_state_0.pth"]
    held = {0: [], **{node: own[node] + own[node - 1] for node in range(1, NODES)}}
    for node, kept in held.items():
        directory = copies / f"node-{node}" / "checkpoint-100"
        directory.mkdir(parents=True)
        for name in kept:
            os.link(source / name, directory / name)
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--node-mb-s", type=float, default=150.0)
    parser.add_argument("--name", default="resume_from_node_copies")
    args = parser.parse_args(argv)
    with scratch_dir("spotray-node-copies-") as work, LocalS3Server(work / "s3") as server:
        server.create_bucket(BUCKET)
        store_uri = f"s3://{BUCKET}/run"
        store = S3ObjectStore(parse_uri(store_uri), server.config)
        size = plant_checkpoint(store, work, args.size_mb, keep_source=True)
        held = plant_copies(work / "source", work / "copies")
        env = {**os.environ, **server.env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proxies = [FaultProxy(server.port, download_bytes_per_s=args.node_mb_s * MB).start() for _ in range(NODES)]
        try:
            legs: dict[str, list[dict[str, Any]]] = {"kept": [], "read_once": []}
            for index in range(args.rounds):
                order = ["kept", "read_once"] if index % 2 == 0 else ["read_once", "kept"]
                for leg in order:
                    legs[leg].append(run_leg(leg, store_uri, env, proxies, work))
                print(f"round {index + 1}: " + ", ".join(f"{leg} {legs[leg][-1]}" for leg in legs), flush=True)
        finally:
            for proxy in proxies:
                proxy.stop()
    seconds = {leg: [round(x["seconds"], 3) for x in values] for leg, values in legs.items()}
    ratio, pairs = paired_ratio(seconds["kept"], seconds["read_once"])
    read_per_size = {leg: [round(x["s3_bytes"] / size, 3) for x in values] for leg, values in legs.items()}
    command = (
        f".venv/bin/python -m bench.micro.node_copies_resume --rounds {args.rounds} --size-mb {args.size_mb}"
        f" --node-mb-s {args.node_mb_s:g}"
    )
    details = {
        "figure": "seconds from a barrier after start-up to every node holding its verified copy",
        "checkpoint_bytes": size,
        "nodes": NODES,
        "node_link_mb_s": args.node_mb_s,
        "copies_held": {str(node): names for node, names in held.items()},
        "seconds": seconds,
        "medians_s": {leg: statistics.median(values) for leg, values in seconds.items()},
        "pair_ratios": pairs,
        "s3_bytes_per_checkpoint_size": read_per_size,
        "parts_s": {
            leg: {part: [x[part] for x in values] for part in ("share_read_s", "exchange_s")}
            for leg, values in legs.items()
        },
        "machine": machine_details(),
        "load_average_after": os.getloadavg(),
        "earlier_runs": earlier_runs(args.name),
    }
    baseline = "the same resume without the nodes' copies: each node reads a quarter from S3, then the exchange"
    path = write_result(args.name, ratio, GOAL, baseline, command, details)
    print(f"from node copies / from S3: {ratio:.3f} (goal {GOAL}); S3 bytes / size: {read_per_size}; {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
