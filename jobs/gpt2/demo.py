"""The local resume demo: train, kill -9 part-way, start again, resume from S3, show what was lost.

    make demo            # or: python -m jobs.gpt2.demo --max-steps 300 --kill-at 170

1. starts an embedded S3 server (SeaweedFS) on loopback and a bucket for checkpoints;
2. runs the GPT-2 job, which syncs a checkpoint to S3 every ``--save-steps`` steps;
3. kills the training process with SIGKILL at step ``--kill-at`` (no warning, like a lost spot VM);
4. starts the very same command again: it finds the latest complete checkpoint and resumes;
5. prints the resume step, the steps lost, the final loss, and writes a PNG of the loss curve.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from train.checkpoint import list_checkpoints
from train.events import read_events
from train.local_s3 import LocalS3Server
from train.plot import Attempt, plot_loss_across_attempts, split_attempts
from train.store import S3ObjectStore, parse_uri

BUCKET = "spotray-demo"
BAR_WIDTH = 30


def progress_line(attempt: Attempt | None, max_steps: int, label: str) -> str:
    step = attempt.last_step if attempt else 0
    filled = int(BAR_WIDTH * step / max_steps)
    if attempt and attempt.losses:
        loss = f"loss {attempt.losses[-1][1]:.3f}"
    elif attempt and attempt.resumed_from:
        loss = f"resuming from checkpoint-{attempt.resumed_from}"
    else:
        loss = "starting (imports, model)"
    saved = attempt.checkpoints[-1] if attempt and attempt.checkpoints else None
    checkpoint = f"last checkpoint in S3: step {saved}" if saved else "no checkpoint yet"
    return f"  {label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] step {step:>4}/{max_steps}  {loss}  |  {checkpoint}"


class ProgressPrinter:
    """Redraws one line on a terminal; prints a line per 10% when the output is a file (CI logs)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last_decile = -1

    def show(self, line: str, fraction: float) -> None:
        if self.tty:
            print("\r" + line, end="", flush=True)
        elif int(fraction * 10) > self.last_decile:
            self.last_decile = int(fraction * 10)
            print(line, flush=True)

    def done(self) -> None:
        if self.tty:
            print()
        self.last_decile = -1


def run_attempt(
    command: list[str], env: dict[str, str], events: Path, log_path: Path, *, max_steps: int, kill_at: int | None
) -> Attempt:
    """Run one attempt, drawing progress; SIGKILL it at ``kill_at``. Returns what it did."""
    index = len(split_attempts(read_events(events)))
    printer = ProgressPrinter()
    with log_path.open("w") as log_file:
        child = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        while True:
            attempts = split_attempts(read_events(events))
            current = attempts[index] if len(attempts) > index else None
            printer.show(
                progress_line(current, max_steps, f"attempt {index + 1}"),
                (current.last_step if current else 0) / max_steps,
            )
            # The demo is about resuming, so it waits for a first checkpoint to be complete.
            if kill_at is not None and current and current.last_step >= kill_at and current.checkpoints:
                child.kill()  # SIGKILL: no handler runs, nothing is flushed, like a VM that vanishes
                child.wait()
                break
            if child.poll() is not None:
                final = split_attempts(read_events(events))[index:]
                printer.show(progress_line(final[0] if final else None, max_steps, "finished "), 1.0)
                break
            time.sleep(0.1)
    printer.done()
    if child.returncode not in (0, -9):
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"attempt {index + 1} failed with exit code {child.returncode}; log {log_path}:\n{tail}")
    return split_attempts(read_events(events))[index]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.gpt2.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--save-steps", type=int, default=25, help="checkpoint to S3 every N steps")
    parser.add_argument("--kill-at", type=int, default=None, help="step at which to SIGKILL (default: ~55%%)")
    parser.add_argument("--output", type=Path, default=Path("demo-output"), help="where logs, S3 data and the PNG go")
    args = parser.parse_args(argv)
    if args.kill_at is None:
        # Deliberately between two checkpoints, so that some steps are lost and must be redone.
        args.kill_at = int(args.max_steps * 0.55) // args.save_steps * args.save_steps + args.save_steps // 2 + 3
    if not args.save_steps < args.kill_at < args.max_steps:
        parser.error(f"--kill-at must lie after the first checkpoint ({args.save_steps}) and before --max-steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output: Path = args.output.resolve()
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    events = output / "events.jsonl"
    uri = f"s3://{BUCKET}/gpt2-demo"
    print("spotray demo: resumable training that survives kill -9\n")
    print(f"  output: {output}")
    started = time.monotonic()
    with LocalS3Server(output / "s3") as server:
        server.create_bucket(BUCKET)
        print(f"  S3 (SeaweedFS) on {server.endpoint_url}, checkpoints to {uri} every {args.save_steps} steps\n")
        env = {**os.environ, **server.env(), "PYTHONUNBUFFERED": "1"}
        command = [
            sys.executable, "-m", "jobs.gpt2",
            "--checkpoint-uri", uri,
            "--workdir", str(output / "work"),
            "--max-steps", str(args.max_steps),
            "--save-steps", str(args.save_steps),
            "--events", str(events),
        ]  # fmt: skip
        print(f"1) training a small GPT-2; it will be killed with SIGKILL at step {args.kill_at}")
        first = run_attempt(
            command, env, events, output / "attempt-1.log", max_steps=args.max_steps, kill_at=args.kill_at
        )
        store = S3ObjectStore(parse_uri(uri), server.config)
        print(f"   killed at step {first.last_step}. In S3 now:")
        for info in list_checkpoints(store):
            state = "complete" if info.complete else f"INCOMPLETE ({info.problem})"
            print(f"     checkpoint-{info.step:<5} {info.size_bytes / 1e6:6.1f} MB  {state}")
        print("\n2) starting the same command again (a new process knows nothing but the S3 URI)")
        second = run_attempt(command, env, events, output / "attempt-2.log", max_steps=args.max_steps, kill_at=None)
    resumed_from = second.resumed_from or 0
    png = plot_loss_across_attempts(
        [first, second],
        output / "loss.png",
        f"GPT-2 (tiny) killed at step {first.last_step}, resumed from {resumed_from}",
    )
    final_loss = second.losses[-1][1] if second.losses else float("nan")
    print("\nresult")
    print(f"  killed at step        {first.last_step}")
    print(f"  resumed from step     {resumed_from} (the latest complete checkpoint in S3)")
    print(
        f"  steps lost and redone {first.last_step - resumed_from} (at most one checkpoint interval: {args.save_steps})"
    )
    print(f"  finished at step      {second.last_step}/{args.max_steps}, final loss {final_loss:.3f}")
    print(f"  final checkpoint      {uri}/checkpoint-{second.last_step}")
    print(f"  loss curve            {png}")
    print(f"  logs                  {output}/attempt-1.log, attempt-2.log, events.jsonl")
    print(f"  took                  {time.monotonic() - started:.0f}s")
    return 0 if second.finished and second.last_step == args.max_steps else 1


if __name__ == "__main__":
    sys.exit(main())
