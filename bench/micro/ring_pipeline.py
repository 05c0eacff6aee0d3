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

``--link-mb-s N`` puts each node in a network namespace of its own, the two joined by a veth pair
whose both ends a token bucket (``tc qdisc tbf``) limits to N MB/s, and starts the two processes there
by hand (no torchrun: gloo binds the veth, 198.19.73.0/30, the range ENV.md sets aside for benchmarks).
That stands for nodes whose link, not their cores, is the bottleneck. Needs root (``ip netns``).

``--baseline-tree DIR`` compares two versions of the ring instead, both with two chunks in flight:
this checkout's (A) against another checkout's (B, e.g. ``git worktree add DIR COMMIT``), each pair a
process of each, alternated, one warm-up round in each process not counted (result
``ring_receiver_hash``: the receiver no longer hashing what arrives, goal <= 0.9, fixed before its
first run).

    .venv/bin/python -m bench.micro.ring_pipeline [--pairs 5] [--size-mb 2048] [--link-mb-s 150]
    .venv/bin/python -m bench.micro.ring_pipeline --baseline-tree DIR --name ring_receiver_hash
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.common import ROOT, alternating_pairs, machine_details, paired_ratio, scratch_dir, write_result
from bench.micro.read_once import earlier_runs

NODE_SCRIPT = Path(__file__).with_name("ring_pipeline_node.py")
GOAL = "<= 0.8"
TREE_GOAL = "<= 0.9"  # --baseline-tree: a version of the ring against another
PIPELINED, LOCKSTEP = 2, 1
LINK_NETNS = ("spotray-ring-0", "spotray-ring-1")
LINK_ADDRESSES = ("198.19.73.1", "198.19.73.2")
LINK_PORT = "29573"


@contextlib.contextmanager
def rate_limited_link(mb_s: int) -> Iterator[None]:
    """Two network namespaces joined by one veth pair, each end limited to ``mb_s`` MB/s; removed after."""

    def ip(*argv: str) -> None:
        subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)

    try:
        for netns in LINK_NETNS:
            ip("netns", "add", netns)
        ip("link", "add", "name", "ring0", "netns", LINK_NETNS[0], "type", "veth", "peer", "name", "ring1",
           "netns", LINK_NETNS[1])  # fmt: skip
        for node, netns in enumerate(LINK_NETNS):
            device = f"ring{node}"
            ip("-n", netns, "addr", "add", f"{LINK_ADDRESSES[node]}/30", "dev", device)
            ip("-n", netns, "link", "set", device, "up")
            ip("-n", netns, "link", "set", "lo", "up")
            subprocess.run(
                ["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", device, "root", "tbf",
                 "rate", f"{mb_s * 8}mbit", "burst", "1mb", "latency", "100ms"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
        yield
    finally:
        for netns in LINK_NETNS:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)


def run_nodes(node_argv: list[str], link_mb_s: int | None) -> subprocess.CompletedProcess[str]:
    """Both nodes' processes: torchrun on loopback, or one process per namespace over the limited link."""
    if link_mb_s is None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   *node_argv]  # fmt: skip
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    with rate_limited_link(link_mb_s):
        nodes = []
        for node, netns in enumerate(LINK_NETNS):
            env = os.environ | {
                "RANK": str(node), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": LINK_ADDRESSES[0], "MASTER_PORT": LINK_PORT, "GLOO_SOCKET_IFNAME": f"ring{node}",
            }  # fmt: skip
            command = ["ip", "netns", "exec", netns, sys.executable, *node_argv]
            nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        try:
            outputs = [process.communicate(timeout=3600) for process in nodes]
        finally:
            for process in nodes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        failed = next((p.returncode for p in nodes if p.returncode != 0), 0)
        stdout, stderr = outputs[0][0], "\n".join(out[1] for out in outputs)
        return subprocess.CompletedProcess(nodes[0].args, failed, stdout, stderr)


def against_tree(args: argparse.Namespace) -> int:
    """This checkout's ring against ``--baseline-tree``'s, a process each per pair, alternated."""
    baseline = args.baseline_tree.resolve()
    seconds: dict[str, list[float]] = {"this": [], "baseline": []}
    with scratch_dir("spotray-ring-") as work:
        for side, leg in alternating_pairs(args.pairs, "this", "baseline"):
            tree = ROOT if side == "this" else baseline
            node_argv = [str(tree / NODE_SCRIPT.relative_to(ROOT)), str(work / leg), str(args.size_mb), "2,2"]
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       *node_argv]  # fmt: skip
            env = os.environ | {"PYTHONPATH": str(tree)}  # its own spotray, not the venv's editable one
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=3600, check=False)
            if done.returncode != 0:
                print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
                return done.returncode
            rounds = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            seconds[side].append(rounds[-1]["seconds"])  # the first round warms the page cache up
            shutil.rmtree(work / leg)  # its source, copies and staged files: about twice --size-mb
    ratio, pairs = paired_ratio(seconds["this"], seconds["baseline"])
    size = args.size_mb + 1
    details = {
        "size_mb": size,
        "pairs": args.pairs,
        "baseline_tree_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=baseline, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "seconds": seconds,
        "median_s": {side: statistics.median(values) for side, values in seconds.items()},
        "mb_s": {side: [round(size / s, 1) for s in values] for side, values in seconds.items()},
        "pair_ratios": pairs,
        "machine": machine_details(),
        "earlier_runs": earlier_runs(args.name),
    }
    path = write_result(
        args.name,
        ratio,
        TREE_GOAL,
        f"the ring of the checkout at {details['baseline_tree_commit']}, two chunks in flight in both, "
        "a process of each per pair, alternated",
        f"python -m bench.micro.ring_pipeline --baseline-tree DIR --pairs {args.pairs} --size-mb {args.size_mb}",
        details,
    )
    print(f"{args.name}: {ratio:.3f} (goal {TREE_GOAL}); pairs {pairs}; MB/s {details['mb_s']} -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--link-mb-s", type=int, help="both nodes behind one veth pair limited to this rate")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout whose ring is B (both pipelined)")
    parser.add_argument("--name", help="the result's name (ring_pipeline, or ring_pipeline_link with --link-mb-s)")
    args = parser.parse_args(argv)
    if args.baseline_tree is not None:
        args.name = args.name or "ring_receiver_hash"
        return against_tree(args)
    args.name = args.name or ("ring_pipeline" if args.link_mb_s is None else "ring_pipeline_link")
    order = [PIPELINED, LOCKSTEP] + [setting for setting, _ in alternating_pairs(args.pairs, PIPELINED, LOCKSTEP)]
    with scratch_dir("spotray-ring-") as work:
        done = run_nodes([str(NODE_SCRIPT), str(work), str(args.size_mb), ",".join(map(str, order))], args.link_mb_s)
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
        "link_mb_s": args.link_mb_s,
        "machine": machine_details(),
    }
    details["earlier_runs"] = earlier_runs(args.name)
    path = write_result(
        args.name,
        ratio,
        GOAL,
        f"the same ring in lockstep (CHUNKS_IN_FLIGHT={LOCKSTEP}), alternated in one pair of processes",
        f"python -m bench.micro.ring_pipeline --pairs {args.pairs} --size-mb {args.size_mb}"
        + ("" if args.link_mb_s is None else f" --link-mb-s {args.link_mb_s}"),
        details,
    )
    print(f"{args.name}: {ratio:.3f} (goal {GOAL}); pairs {pairs}; MB/s {details['mb_s']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
