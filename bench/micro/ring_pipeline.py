"""The node-copies ring with two chunks on the wire each way (A) against one, the lockstep it began with (B).

Issue 73, item 4: a 15 s spot notice with a 4 GB state. notice_node_copies (bench/micro/notice_copies.py)
showed where the notice's time goes: the save (2.3-3.2 s), then the ring at 312-340 MB/s (12-13 s for
4.1 GB), 14.4-16 s against the 15 s notice. In lockstep (one chunk each way at a time) the link is idle
while a chunk is read and hashed on one side and written and hashed on the other, and those wait while
the chunk crosses. With two in flight (train/checkpoints/node_copies.py ``CHUNKS_IN_FLIGHT``), one chunk
crosses while the next is read and the last one written.

Two processes under torchrun stand for two nodes (gloo over loopback, each with its own copies
directory); node 0 sends a ``--size-mb`` MB file, node 1 one of 1 MB. Rounds alternate A and B in one
pair of processes, the order flipping every pair (bench/micro/ring_pipeline_node.py), after one
warm-up round of each that is not counted.

Figure: ratio = median over pairs of A's seconds / B's (goal <= 0.8, fixed before the first run); the
ring's MB/s for each leg is reported beside it. On this machine's two cores each process's thread,
gloo's own threads and the page cache share them; a real node has more cores and a slower link than
loopback, so the gain there depends on which of the two is the bottleneck.

    .venv/bin/python -m bench.micro.ring_pipeline [--pairs 5] [--size-mb 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, alternating_pairs, machine_details, paired_ratio, scratch_dir, write_result
from bench.micro.read_once import earlier_runs

NODE_SCRIPT = Path(__file__).with_name("ring_pipeline_node.py")
GOAL = "<= 0.8"
PIPELINED, LOCKSTEP = 2, 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--name", default="ring_pipeline")
    args = parser.parse_args(argv)
    order = [PIPELINED, LOCKSTEP] + [setting for setting, _ in alternating_pairs(args.pairs, PIPELINED, LOCKSTEP)]
    with scratch_dir("spotray-ring-") as work:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(NODE_SCRIPT), str(work), str(args.size_mb), ",".join(map(str, order)),
        ]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
        if done.returncode != 0:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
            return done.returncode
    rounds = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][2:]  # warm-ups
    seconds = {s: [r["seconds"] for r in rounds if r["setting"] == s] for s in (PIPELINED, LOCKSTEP)}
    ratio, pairs = paired_ratio(seconds[PIPELINED], seconds[LOCKSTEP])
    size = args.size_mb + 1
    legs = {"pipelined": seconds[PIPELINED], "lockstep": seconds[LOCKSTEP]}
    details = {
        "size_mb": size,
        "pairs": args.pairs,
        "order": order,
        "seconds": legs,
        "median_s": {leg: statistics.median(values) for leg, values in legs.items()},
        "mb_s": {leg: [round(size / s, 1) for s in values] for leg, values in legs.items()},
        "pair_ratios": pairs,
        "machine": machine_details(),
    }
    details["earlier_runs"] = earlier_runs(args.name)
    path = write_result(
        args.name,
        ratio,
        GOAL,
        f"the same ring in lockstep (CHUNKS_IN_FLIGHT={LOCKSTEP}), alternated in one pair of processes",
        f"python -m bench.micro.ring_pipeline --pairs {args.pairs} --size-mb {args.size_mb}",
        details,
    )
    print(f"{args.name}: {ratio:.3f} (goal {GOAL}); pairs {pairs}; MB/s {details['mb_s']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
