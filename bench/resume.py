"""How much later the first step comes when a run resumes from S3 than when it starts fresh.

Both sides are the real job (``python -m spotray.jobs.gpt2``) started as a new process, timed from the
process start to its first ``step`` event: interpreter and library imports, model build, and for
the resume side also finding the latest complete checkpoint, downloading it, verifying its
checksums and loading model, optimizer, scheduler and RNG state. Fresh and resume alternate for
``--rounds`` rounds; the ratio is median(resume) / median(fresh). Goal <= 1.2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_details, write_result
from spotray.train.checkpoint import latest_complete_checkpoint
from spotray.train.events import read_events
from spotray.train.local_s3 import LocalS3Server
from spotray.train.store import S3ObjectStore, parse_uri

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
        "--events", str(workdir / "events.jsonl"),
    ]  # fmt: skip


def seconds_to_first_step(command: list[str], env: dict[str, str], events: Path) -> tuple[float, int | None]:
    """Start ``command``; return seconds until its first step event and the step it resumed from."""
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while child.poll() is None:
            logged = list(read_events(events))
            if any(e["event"] == "step" for e in logged):
                elapsed = time.perf_counter() - started
                start = next(e for e in logged if e["event"] == "start")
                return elapsed, start["resumed_from"]
            time.sleep(0.01)
        raise RuntimeError(f"{command} exited with {child.returncode} before its first step")
    finally:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    fresh_s: list[float] = []
    resume_s: list[float] = []
    with LocalS3Server(root / "s3") as server:
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
            sides = ["fresh", "resume"] if round_index % 2 == 0 else ["resume", "fresh"]
            for side in sides:
                # A new workdir each time: nothing cached locally, the checkpoint comes from S3.
                workdir = root / f"{side}-{round_index}"
                uri = f"s3://{BUCKET}/fresh-{round_index}" if side == "fresh" else resume_uri
                seconds, resumed_from = seconds_to_first_step(
                    job_command(uri, workdir, 10 * args.save_steps, args), env, workdir / "events.jsonl"
                )
                assert (resumed_from is None) == (side == "fresh"), f"{side} run resumed from {resumed_from}"
                (fresh_s if side == "fresh" else resume_s).append(seconds)
                print(f"round {round_index + 1} {side:>6}: first step after {seconds:.2f}s")
    ratio = statistics.median(resume_s) / statistics.median(fresh_s)
    write_result(
        "resume_first_step",
        ratio,
        "<= 1.2",
        "a fresh start of the same job (empty checkpoint prefix), process start to first step",
        "make bench  (or: .venv/bin/python -m bench.resume " + " ".join(sys.argv[1:]) + ")",
        {
            "fresh_s": [round(s, 3) for s in fresh_s],
            "resume_s": [round(s, 3) for s in resume_s],
            "median_fresh_s": round(statistics.median(fresh_s), 3),
            "median_resume_s": round(statistics.median(resume_s), 3),
            "resumed_checkpoint_step": latest.step,
            "checkpoint_mb": round(latest.manifest.total_bytes / 1e6, 1),
            "model": f"GPT-2 n_layer={args.n_layer} n_embd={args.n_embd}",
            **machine_details(),
        },
    )
    print(f"\nresume_first_step {ratio:.3f} (goal <= 1.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
