"""A resume on four nodes: the checkpoint read from S3 once per run (A) against once per node (B).

Issue 73, item 4: with N nodes, each downloading the whole checkpoint reads N times its size from the
store, each node through its own link, at the moment the whole run waits. Read once
(train/checkpoints/shared_read.py), each node reads a share and the nodes exchange the shares.

Four torchrun processes on this machine stand for four nodes, each with its own directory and its
own link to S3: a proxy (bench/campaigns/fault_proxy.py) per node, limited to ``--node-mb-s`` MB/s
from the server to the node (a real bucket's per-node rate, not loopback's), in front of one
SeaweedFS. A checkpoint shaped like a Hugging Face one (model.safetensors 1/3, optimizer.pt 2/3, small
files; ``--size-mb`` in all, random bytes) is uploaded once. Then, for ``--rounds`` rounds, A and B
back to back, the order flipping every round, each node's directory emptied before each leg:

- A: every process resumes with ``ResumeFetch`` (each node reads its share, the nodes exchange);
- B: every process fetches the checkpoint whole for its node (``fetch_resume_checkpoint``), as
  each node did before read-once.

Each leg measures, inside the processes, from a barrier after start-up to a barrier once every node
holds its verified copy (the resume's own time), and, at the proxies, the bytes the nodes read from S3.

Figures: ratio = median of each round's A seconds / B seconds (goal <= 0.5, fixed before the first
run: 4 nodes reading 1/4 each through their own links should take well under half the time of each
reading the whole, if the exchange between nodes is faster than a node's link to S3); and the S3 bytes
per resume / checkpoint size for each leg (goal 1.0 for A; B reads 4.0).

The machine's two cores carry SeaweedFS, the proxies (Python) and the four processes; on loopback the
exchange between "nodes" is a memory copy through gloo, where a real cluster's network is slower than
that but faster than a bucket's per-node rate. No added latency per request: the proxy limits the rate.

    .venv/bin/python -m bench.micro.read_once [--rounds 3] [--size-mb 2048] [--node-mb-s 150]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.campaigns.fault_proxy import FaultProxy
from bench.common import RESULTS_DIR, ROOT, machine_details, paired_ratio, scratch_dir, write_result
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import upload_checkpoint
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore

NODES = 4
BUCKET = "bench-read-once"
GOAL = "<= 0.5"
MB = 1_000_000
NODE_SCRIPT = Path(__file__).with_name("read_once_node.py")


def plant_checkpoint(store: S3ObjectStore, work: Path, size_mb: int, *, keep_source: bool = False) -> int:
    """Upload checkpoint-100 of about ``size_mb`` MB (its files stay in ``work/source`` with
    ``keep_source``); its size in bytes."""
    source = work / "source"
    source.mkdir()
    total = size_mb * MB
    sizes = {"model.safetensors": total // 3, "optimizer.pt": total - total // 3 - 40_000}
    sizes |= {f"rng_state_{rank}.pth": 10_000 for rank in range(NODES)}
    for name, size in sizes.items():
        with (source / name).open("wb") as handle:
            left = size
            while left:
                chunk = min(left, 64 << 20)
                handle.write(os.urandom(chunk))
                left -= chunk
    (source / "trainer_state.json").write_text('{"global_step": 100}')
    upload_checkpoint(store, source, 100, world_size=NODES)
    size = sum(path.stat().st_size for path in source.iterdir())
    if not keep_source:
        shutil.rmtree(source)  # the disk holds the store's copy and the nodes' copies, not this one too
    return size


def run_leg(leg: str, store_uri: str, env: dict[str, str], proxies: list[FaultProxy], work: Path) -> dict[str, Any]:
    """One leg: four processes, each through its own proxy; seconds and S3 bytes."""
    nodes = work / "nodes"
    shutil.rmtree(nodes, ignore_errors=True)
    before = sum(proxy.downloaded_bytes for proxy in proxies)
    out = work / f"{leg}.json"
    endpoints = ",".join(proxy.endpoint_url for proxy in proxies)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NODES),
        str(NODE_SCRIPT), leg, store_uri, str(nodes), endpoints, str(out),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800, cwd=ROOT)
    result = json.loads(out.read_text())
    leg_result: dict[str, Any] = {"seconds": result["seconds"]}
    if leg != "per_node":  # the slowest node's share read and exchange
        for part in ("share_read_s", "exchange_s"):
            leg_result[part] = round(max(node[part] for node in result["per_node"]), 3)
    leg_result["s3_bytes"] = sum(p.downloaded_bytes for p in proxies) - before
    return leg_result


def earlier_runs(name: str) -> list[dict[str, Any]]:
    """The runs already in the result file, each with its rounds: every run is reported, not only the last."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    details = old.get("details") or {}
    this = {k: old.get(k) for k in ("commit", "measured_at", "ratio", "command")}
    this |= {k: details.get(k) for k in ("seconds", "s3_bytes_per_checkpoint_size", "pair_ratios")}
    return [*details.get("earlier_runs", []), this]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--node-mb-s", type=float, default=150.0)
    parser.add_argument("--name", default="resume_read_once")
    args = parser.parse_args(argv)
    with scratch_dir("spotray-read-once-") as work, LocalS3Server(work / "s3") as server:
        server.create_bucket(BUCKET)
        store_uri = f"s3://{BUCKET}/run"
        store = S3ObjectStore(parse_uri(store_uri), server.config)
        size = plant_checkpoint(store, work, args.size_mb)
        env = {**os.environ, **server.env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        limit = args.node_mb_s * MB
        proxies = [FaultProxy(server.port, download_bytes_per_s=limit).start() for _ in range(NODES)]
        try:
            legs: dict[str, list[dict[str, Any]]] = {"read_once": [], "per_node": []}
            for index in range(args.rounds):
                order = ["read_once", "per_node"] if index % 2 == 0 else ["per_node", "read_once"]
                for leg in order:
                    legs[leg].append(run_leg(leg, store_uri, env, proxies, work))
                print(f"round {index + 1}: " + ", ".join(f"{leg} {legs[leg][-1]}" for leg in legs), flush=True)
        finally:
            for proxy in proxies:
                proxy.stop()
    seconds = {leg: [round(x["seconds"], 3) for x in values] for leg, values in legs.items()}
    ratio, pairs = paired_ratio(seconds["read_once"], seconds["per_node"])
    read_per_size = {leg: [round(x["s3_bytes"] / size, 3) for x in values] for leg, values in legs.items()}
    command = (
        f".venv/bin/python -m bench.micro.read_once --rounds {args.rounds} --size-mb {args.size_mb}"
        f" --node-mb-s {args.node_mb_s:g}"
    )
    details = {
        "figure": "seconds from a barrier after start-up to every node holding its verified copy",
        "checkpoint_bytes": size,
        "nodes": NODES,
        "node_link_mb_s": args.node_mb_s,
        "seconds": seconds,
        "medians_s": {leg: statistics.median(values) for leg, values in seconds.items()},
        "pair_ratios": pairs,
        "s3_bytes_per_checkpoint_size": read_per_size,
        "s3_read_goal": "read_once 1.0 (per_node reads one copy per node: 4.0)",
        "read_once_parts_s": {part: [x[part] for x in legs["read_once"]] for part in ("share_read_s", "exchange_s")},
        "machine": machine_details(),
        "load_average_after": os.getloadavg(),
        "earlier_runs": earlier_runs(args.name),
    }
    baseline = "each node fetches the whole checkpoint from S3 through its own link (fetch_resume_checkpoint)"
    path = write_result(args.name, ratio, GOAL, baseline, command, details)
    print(f"read once / per node: {ratio:.3f} (goal {GOAL}); S3 bytes / size: {read_per_size}; {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
