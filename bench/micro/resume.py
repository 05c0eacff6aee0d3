"""How much later the first step comes when a run resumes from S3 than when it starts fresh.

Both sides are the real job (``python -m spotray.jobs.gpt2``) started as a new process, timed from the
process start to its first ``step`` event: interpreter and library imports, Ray, model build, and for
the resume side also finding the latest complete checkpoint, downloading it, verifying its
checksums and loading model, optimizer, scheduler and RNG state. Fresh and resume alternate for
``--rounds`` rounds; the ratio is median(resume) / median(fresh). Goal <= 1.1 at 1 GB on CPU.

The default model (GPT-2, 12 layers of 768, 256-byte vocabulary: 85M parameters) makes a checkpoint
of about 1 GB (weights 0.34 GB, Adam state 0.68 GB). Each resume also says how long the background
fetch took and how much of it the worker still waited for after building its model.

A third side measures a worker restarted on a node that holds the verified copy: what reusing it
costs today (its size and time checked against the record written when it was verified) against
what it cost before (every file hashed again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import machine_details, scratch_dir, write_result
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    Manifest,
    latest_complete_checkpoint,
    verified_copy_unchanged,
    verify_local_checkpoint,
)
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore

BUCKET = "bench-resume"


def job_command(uri: str, workdir: Path, max_steps: int, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "spotray.jobs.gpt2",
        "--checkpoint-uri", uri,
        "--data-uri", f"s3://{BUCKET}/data",
        "--workers", "1",
        "--workdir", str(workdir),
        "--max-steps", str(max_steps),
        "--save-steps", str(args.save_steps),
        "--n-layer", str(args.n_layer),
        "--n-embd", str(args.n_embd),
        "--batch-size", str(args.batch_size),
        "--events", str(workdir / "events.jsonl"),
    ]  # fmt: skip


@dataclass
class Timeline:
    """One run, in seconds from its process start."""

    first_step_s: float
    worker_start_s: float
    resumed_from: int | None
    resume_fetch_s: float | None
    resume_wait_s: float | None


def time_to_first_step(command: list[str], env: dict[str, str], events: Path) -> Timeline:
    """Start ``command``; time its first step event, and read when its worker started and what it waited for."""
    started_wall = time.time()
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while child.poll() is None:
            logged = list(read_events(events))
            if any(e["event"] == "step" for e in logged):
                elapsed = time.perf_counter() - started
                start = next(e for e in logged if e["event"] == "start")
                worker = next(e for e in logged if e["event"] == "worker_start")
                return Timeline(
                    first_step_s=elapsed,
                    worker_start_s=worker["time"] - started_wall,
                    resumed_from=start["resumed_from"],
                    resume_fetch_s=start.get("resume_fetch_s"),
                    resume_wait_s=start.get("resume_wait_s"),
                )
            time.sleep(0.01)
        raise RuntimeError(f"{command} exited with {child.returncode} before its first step")
    finally:
        child.kill()
        child.wait()


def reuse_costs(copy_dir: Path) -> dict[str, float]:
    """Checking a node's verified copy before reuse: hashing every file again (before) vs its record (now)."""
    manifest = Manifest.from_json((copy_dir / MANIFEST_NAME).read_bytes(), str(copy_dir))
    started = time.perf_counter()
    verify_local_checkpoint(copy_dir, manifest)
    rehash_s = time.perf_counter() - started
    started = time.perf_counter()
    assert verified_copy_unchanged(copy_dir, manifest)
    record_s = time.perf_counter() - started
    return {"reuse_rehash_s": round(rehash_s, 3), "reuse_record_s": round(record_s, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=2, help="global batch: small keeps a CPU step short")
    args = parser.parse_args(argv)
    runs: dict[str, list[Timeline]] = {"fresh": [], "resume": [], "restart": []}
    with scratch_dir("bench-resume-") as root, LocalS3Server(root / "s3") as server:
        server.create_bucket(BUCKET)
        env = {**os.environ, **server.env()}
        resume_uri = f"s3://{BUCKET}/resume"
        prepared = subprocess.run(
            job_command(resume_uri, root / "prepare", args.save_steps, args), env=env, capture_output=True, check=False
        )
        if prepared.returncode != 0:
            raise SystemExit(prepared.stderr.decode(errors="replace")[-3000:])
        latest = latest_complete_checkpoint(S3ObjectStore(parse_uri(resume_uri), server.config))
        assert latest is not None
        assert latest.manifest is not None
        for round_index in range(args.rounds):
            sides = ["fresh", "resume", "restart"] if round_index % 2 == 0 else ["restart", "resume", "fresh"]
            for side in sides:
                # A new workdir for fresh and resume: nothing cached locally, the checkpoint comes from S3.
                # A restart runs in the workdir of the round's resume, which holds its verified copy.
                workdir = root / f"{'resume' if side == 'restart' else side}-{round_index}"
                if side == "restart" and not (workdir / "gpt2" / "resume").is_dir():
                    continue  # this round's resume comes next
                uri = f"s3://{BUCKET}/fresh-{round_index}" if side == "fresh" else resume_uri
                (workdir / "events.jsonl").unlink(missing_ok=True)
                command = job_command(uri, workdir, 10 * args.save_steps, args)
                run = time_to_first_step(command, env, workdir / "events.jsonl")
                assert (run.resumed_from is None) == (side == "fresh"), f"{side} run resumed from {run.resumed_from}"
                runs[side].append(run)
                fetched = ""
                if run.resume_fetch_s is not None:
                    fetched = f", fetch {run.resume_fetch_s:.2f}s, waited {run.resume_wait_s:.2f}s"
                print(
                    f"round {round_index + 1} {side:>7}: first step after {run.first_step_s:.2f}s "
                    f"(worker started at {run.worker_start_s:.2f}s{fetched})",
                    flush=True,
                )
        copy_dir = root / "resume-0" / "gpt2" / "resume" / latest.prefix
        costs = reuse_costs(copy_dir)
    fresh_s = [run.first_step_s for run in runs["fresh"]]
    resume_s = [run.first_step_s for run in runs["resume"]]
    ratio = statistics.median(resume_s) / statistics.median(fresh_s)
    restart_s = [run.first_step_s for run in runs["restart"]]
    write_result(
        "resume_first_step",
        ratio,
        "<= 1.1",
        "a fresh start of the same job (empty checkpoint prefix), process start to first step",
        "make bench  (or: .venv/bin/python -m bench.micro.resume " + " ".join(sys.argv[1:]) + ")",
        {
            "fresh_s": [round(s, 3) for s in fresh_s],
            "resume_s": [round(s, 3) for s in resume_s],
            "median_fresh_s": round(statistics.median(fresh_s), 3),
            "median_resume_s": round(statistics.median(resume_s), 3),
            "restart_s": [round(s, 3) for s in restart_s],
            "median_restart_s": round(statistics.median(restart_s), 3) if restart_s else None,
            "resume_fetch_s": [run.resume_fetch_s for run in runs["resume"]],
            "resume_wait_s": [run.resume_wait_s for run in runs["resume"]],
            "restart_fetch_s": [run.resume_fetch_s for run in runs["restart"]],
            "worker_start_s": {side: [round(r.worker_start_s, 3) for r in rs] for side, rs in runs.items()},
            **costs,
            "resumed_checkpoint_step": latest.step,
            "checkpoint_mb": round(latest.manifest.total_bytes / 1e6, 1),
            "model": f"GPT-2 n_layer={args.n_layer} n_embd={args.n_embd}",
            **machine_details(),
        },
    )
    record_s, rehash_s = costs["reuse_record_s"], costs["reuse_rehash_s"]
    print(f"\nreusing a verified copy: {record_s}s checked by its record, {rehash_s}s hashed again")
    print(f"resume_first_step {ratio:.3f} (goal <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
