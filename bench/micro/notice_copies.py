"""A spot notice shorter than the upload: the emergency checkpoint safe in the nodes' copies (A) against
safe only in the store (B), with a checkpoint of real size.

Issue 73, item 4: a notice gives the pods 15-120 s (GKE about 15 s for ordinary pods); at a bucket's
100-200 MB/s per node a 4 GB state takes longer than 15 s to upload, and a node that waits for the
store is gone before its checkpoint is safe: the run loses every step since the last periodic one.
With node copies (train/checkpoints/node_copies.py) an elastic run's notice counts the checkpoint safe
once the nodes that stay hold it (train/hf/notice.py), and the next start completes it in the store.

Two torchrun processes stand for two nodes, each with its own directory and its own link to S3 (a
proxy limited to ``--node-mb-s`` MB/s both ways, in front of one SeaweedFS); the model carries a
``--size-mb`` buffer, so node 0's share (model.safetensors) is that big (bench/micro/notice_copies_node.py).
Each leg: a run saves at step 3 (waited for in the store), a notice names node 0 at step 6, and the
node is gone ``--notice-s`` seconds later (the bench ends every process then, as the group's restart
would) unless the checkpoint was safe before; then node 1 and an empty node 0 resume and train a step.
For ``--rounds`` rounds, A and B back to back, the order flipping every round:

- A (``copies``): node copies on (spec.checkpoint.nodeCopies 1, the default);
- B (``store``): node copies off (nodeCopies 0), the notice waits for the store.

Figures, each fixed before the first run:
- steps lost / steps since the last periodic checkpoint (3): goal 0 for A (B loses all 3 whenever
  the upload outlasts the notice); the result's ratio is A's median;
- the periodic checkpoint's blocking time (its ``checkpoint_saved`` blocked_s), A / B: goal <= 1.1
  (a second result file, ``node_copies_save_blocking``);
- notice to safe, and notice to the resumed run's first step, in seconds (reported, no goal: A's resume
  first uploads the checkpoint it completes, through the same link).

    .venv/bin/python -m bench.micro.notice_copies [--rounds 3] [--size-mb 4096] [--node-mb-s 150] [--notice-s 15]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.campaigns.fault_proxy import FaultProxy
from bench.common import ROOT, machine_details, paired_ratio, scratch_dir, write_result
from bench.micro.read_once import MB, earlier_runs
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server, free_port

BUCKET = "bench-notice-copies"
NODE_SCRIPT = Path(__file__).with_name("notice_copies_node.py")
SAVE_AT, NOTICE_AT = 3, 6
GOAL, BLOCKING_GOAL = "<= 0.0", "<= 1.1"


def run_nodes(
    leg: str, phase: str, work: Path, store_uri: str, env: list[dict[str, str]], size_mb: int, notice_s: float
) -> bool:
    """Both nodes of one phase; in ``notice``, every process ended ``notice_s`` after the notice if still
    running. True if they ended on their own."""
    port, processes = free_port(), []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), str(NODE_SCRIPT),
            leg, phase, str(work / f"node-{node}"), store_uri, str(size_mb), str(work / f"{phase}.json"),
        ]  # fmt: skip
        with (work / f"{leg}-{phase}-{node}.log").open("w") as log:
            popen = subprocess.Popen(
                command, env=env[node], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )
        processes.append(popen)
    events, deadline, ended = work / "node-0" / "events.jsonl", time.monotonic() + 1800, True
    try:
        while any(p.poll() is None for p in processes):
            noticed = [e for e in read_events(events) if e["event"] == "preemption_notice"] if events.exists() else []
            if noticed and time.time() > noticed[0]["time"] + notice_s:
                ended = False
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{leg} {phase} did not end: see {work}")
            time.sleep(0.1)
    finally:
        # The node is gone; the group's restart takes the rest. torchrun starts its workers in sessions
        # of their own, so every process under each launcher is named and killed, uploads included.
        tree = [p for launcher in processes if launcher.poll() is None for p in _with_descendants(launcher.pid)]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(tree, timeout=30)
        for launcher in processes:
            launcher.wait()
    if ended and any(p.returncode for p in processes):
        raise RuntimeError(f"{leg} {phase} failed: see {work}/{leg}-{phase}-*.log")
    return ended


def _with_descendants(pid: int) -> list[psutil.Process]:
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def ring_rate(progress: Path, since: float) -> float | None:
    """MB/s node 0's ring sent from ``since`` to its last reading (bench/micro/notice_copies_node.py)."""
    if not progress.exists():
        return None
    readings = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    after = [(at, sent) for at, sent, _ in readings if at >= since]
    if len(after) < 2 or after[-1][0] <= after[0][0]:
        return None
    return round((after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0]) / MB, 1)


def run_leg(
    leg: str, work: Path, store_uri: str, env: list[dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    safe_by_itself = run_nodes(leg, "notice", work, store_uri, env, args.size_mb, args.notice_s)
    logged = list(read_events(work / "node-0" / "events.jsonl"))
    [noticed] = [e for e in logged if e["event"] == "preemption_notice"]
    [periodic] = [e for e in logged if e["event"] == "checkpoint_saved" and e["step"] == SAVE_AT]
    safe = json.loads((work / "notice.json").read_text()) if safe_by_itself else None
    [emergency_save] = [e for e in logged if e["event"] == "checkpoint_saved" and e["step"] == NOTICE_AT]
    shutil.rmtree(work / "node-0")  # node 0 went with its disk; a new node takes its place
    run_nodes(leg, "resume", work, store_uri, env, args.size_mb, args.notice_s)
    resumed = json.loads((work / "resume.json").read_text())
    lost = NOTICE_AT - resumed["step"]
    return {
        "steps_lost_fraction": round(lost / (NOTICE_AT - SAVE_AT), 3),
        "resumed_from": resumed["step"],
        "periodic_blocked_s": periodic["blocked_s"],
        "notice_to_safe_s": round(safe["safe_at"] - noticed["time"], 3) if safe else None,
        # Where the notice's time went: the Trainer's save of the state (and its staging), then the ring.
        "notice_to_saved_s": round(emergency_save["time"] - noticed["time"], 3),
        "ring_mb_s_after_the_save": ring_rate(work / "ring-node-0.jsonl", emergency_save["time"]),
        "notice_to_first_step_s": round(resumed["first_step_at"] - noticed["time"], 3),
        "resume_read": resumed["read"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=4096)
    parser.add_argument("--node-mb-s", type=float, default=150.0)
    parser.add_argument("--notice-s", type=float, default=15.0)
    parser.add_argument("--name", default="notice_node_copies")
    args = parser.parse_args(argv)
    legs: dict[str, list[dict[str, Any]]] = {"copies": [], "store": []}
    with scratch_dir("spotray-notice-copies-") as scratch, LocalS3Server(scratch / "s3") as server:
        server.create_bucket(BUCKET)
        limit = args.node_mb_s * MB
        proxies = [
            FaultProxy(server.port, upload_bytes_per_s=limit, download_bytes_per_s=limit).start() for _ in (0, 1)
        ]
        base = {**os.environ, **server.env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env = [base | {"AWS_ENDPOINT_URL": p.endpoint_url, "S3_ENDPOINT_URL": p.endpoint_url} for p in proxies]
        try:
            for index in range(args.rounds):
                for leg in ("copies", "store") if index % 2 == 0 else ("store", "copies"):
                    store_uri = f"s3://{BUCKET}/{leg}-{index}"
                    legs[leg].append(run_leg(leg, scratch / "legs" / leg, store_uri, env, args))
                print(f"round {index + 1}: " + ", ".join(f"{leg} {legs[leg][-1]}" for leg in legs), flush=True)
        finally:
            for proxy in proxies:
                proxy.stop()
    figures = {key: {leg: [x[key] for x in values] for leg, values in legs.items()} for key in legs["copies"][0]}
    lost = statistics.median(figures["steps_lost_fraction"]["copies"])
    blocking, blocking_pairs = paired_ratio(
        figures["periodic_blocked_s"]["copies"], figures["periodic_blocked_s"]["store"]
    )
    command = (
        f".venv/bin/python -m bench.micro.notice_copies --rounds {args.rounds} --size-mb {args.size_mb}"
        f" --node-mb-s {args.node_mb_s:g} --notice-s {args.notice_s:g}"
    )
    details = {
        "figure": "steps lost / steps since the last periodic checkpoint, after a notice naming node 0",
        "state_mb": args.size_mb,
        "node_link_mb_s": args.node_mb_s,
        "notice_s": args.notice_s,
        "rounds": figures,
        "store_leg_steps_lost_fraction_median": statistics.median(figures["steps_lost_fraction"]["store"]),
        "periodic_blocking_pair_ratios": blocking_pairs,
        "machine": machine_details(),
        "load_average_after": os.getloadavg(),
        "earlier_runs": earlier_runs(args.name),
    }
    baseline = "the same notice with node copies off: the emergency checkpoint is safe only in the store"
    path = write_result(args.name, lost, GOAL, baseline, command, details)
    blocking_details = {
        "figure": "blocked_s of the periodic save at step 3, node copies on / off, from the runs above",
        "blocked_s": figures["periodic_blocked_s"],
        "pair_ratios": blocking_pairs,
        "state_mb": args.size_mb,
        "machine": machine_details(),
        "earlier_runs": earlier_runs("node_copies_save_blocking"),
    }
    write_result("node_copies_save_blocking", blocking, BLOCKING_GOAL, "node copies off", command, blocking_details)
    print(f"steps lost (copies): {lost} (goal {GOAL}); blocking copies/store {blocking:.3f} ({BLOCKING_GOAL}); {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
