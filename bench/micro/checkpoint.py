"""What checkpoints cost the training loop: the Trainer's own save, S3 sync, and asynchronous saves.

Five configurations of the same Trainer (GPT-2 from config, byte corpus, CPU) run back to back,
in rotating order, for ``--rounds`` rounds:

- ``none``:  no checkpoints at all;
- ``local``: HF saves every ``--save-steps`` steps to local disk (the baseline a user already pays);
- ``s3``:    the same saves plus ``S3CheckpointCallback`` syncing each one to a real S3 server;
- ``async``: ``AsyncSaveTrainer`` + ``S3CheckpointCallback(async_save=True)``: the loop waits only
  for a copy of the state into host memory; writing and uploading run in the background;
- ``async-dir``: the same, to a directory store (``file://``, as on an NFS volume): every step of
  spotray's path (snapshot, write, hash, copy, manifest, prune) with no S3 server on the 2 cores.
  Against ``none`` it says what the path itself costs training; against ``async``, what the S3
  server, which in production runs elsewhere, takes from it here.

The figures:

- checkpoint_stall: seconds the loop is blocked per checkpoint (from the start of
  ``Trainer._save_checkpoint`` to the end of the last ``on_save`` callback), s3 / local. Goal <= 1.10.
- checkpoint_throughput: steady steps/s (a window that excludes start-up), async / none. Goal >= 0.99
  (issue #15: a save every 20 steps); the synchronous s3 / none and async-dir / none figures are in
  its details.
- checkpoint_async_stall: the async stall / the copy floor (the same state copied once more into
  warm host buffers, timed alone). Goal <= 3 (the GPU goal's multiple; bench/gpu/gpu_checkpoint.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback

from bench.common import machine_details, scratch_dir, write_result
from bench.micro.copy_floor import copy_floor_s
from spotray.contract.uris import parse_uri
from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.train import build_trainer
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore, open_store

BUCKET = "bench"
WARMUP_STEPS = 5


class LoopTimer(TrainerCallback):
    """Records when each step ended and when each save's callbacks finished (put it last)."""

    def __init__(self) -> None:
        self.step_end: dict[int, float] = {}
        self.save_end: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_end[state.global_step] = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.save_end.append(time.perf_counter())


def time_save_starts(trainer: Trainer) -> list[float]:
    """Wrap the trainer's save so that each call's start time is recorded (instrumentation only)."""
    starts: list[float] = []
    original = trainer._save_checkpoint

    def timed(*args: Any, **kwargs: Any) -> Any:
        starts.append(time.perf_counter())
        return original(*args, **kwargs)

    trainer._save_checkpoint = timed  # type: ignore[method-assign]
    return starts


def run_config(
    mode: str, job: Gpt2JobConfig, save_steps: int, server: LocalS3Server, round_index: int
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    asynchronous = mode.startswith("async")
    uri = f"file://{workdir / 'store'}" if mode == "async-dir" else f"s3://{BUCKET}/{mode}-{round_index}"
    job = replace(job, workdir=workdir, async_checkpoints=asynchronous)
    timer = LoopTimer()
    callbacks: list[TrainerCallback] = []
    sync = None
    if mode not in ("none", "local"):
        store = S3ObjectStore(parse_uri(uri), server.config) if uri.startswith("s3://") else open_store(uri)
        sync = S3CheckpointCallback(uri, keep=2, store=store, staging_dir=workdir / "staging", async_save=asynchronous)
        callbacks.append(sync)
    trainer = build_trainer(job, [*callbacks, timer], save_steps=0 if mode == "none" else save_steps)
    save_starts = time_save_starts(trainer)
    trainer.train()
    if sync is not None:
        sync.flush()
        latest = latest_complete_checkpoint(sync.store)
        assert latest is not None
        assert latest.step == job.max_steps, "the last checkpoint did not reach S3"
    first, last = WARMUP_STEPS, job.max_steps
    steps_per_s = (last - first) / (timer.step_end[last] - timer.step_end[first])
    # With save_final the S3 run saves once more at the very end; compare the same periodic saves.
    periodic = [(s, e) for s, e in zip(save_starts, timer.save_end, strict=True) if e <= timer.step_end[last]]
    stalls = [e - s for s, e in periodic]
    checkpoint_mb = sum(f.stat().st_size for f in (workdir / "checkpoints").rglob("*") if f.is_file()) / 1e6
    shutil.rmtree(workdir, ignore_errors=True)
    outcome = {"steps_per_s": steps_per_s, "stalls_s": stalls, "local_checkpoints_mb": checkpoint_mb}
    if mode == "async":
        outcome["copy_floor_s"] = copy_floor_s(trainer)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=85)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    args = parser.parse_args(argv)
    job = Gpt2JobConfig(
        workdir=Path(),
        max_steps=args.max_steps,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        batch_size=16,
    )
    modes = ["none", "local", "s3", "async", "async-dir"]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with scratch_dir("bench-s3-") as s3_dir, LocalS3Server(s3_dir) as server:
        server.create_bucket(BUCKET)
        for round_index in range(args.rounds):
            order = modes[round_index % len(modes) :] + modes[: round_index % len(modes)]
            for mode in order:
                outcome = run_config(mode, job, args.save_steps, server, round_index)
                results[mode].append(outcome)
                stall = statistics.median(outcome["stalls_s"]) if outcome["stalls_s"] else 0.0
                speed = outcome["steps_per_s"]
                print(f"round {round_index + 1} {mode:>9}: {speed:.2f} steps/s, stall {stall * 1000:.0f} ms")

    def median_steps(mode: str) -> float:
        return statistics.median(r["steps_per_s"] for r in results[mode])

    def median_stall(mode: str) -> float:
        return statistics.median(s for r in results[mode] for s in r["stalls_s"])

    stall_ratio = median_stall("s3") / median_stall("local")
    throughput_ratio = median_steps("async") / median_steps("none")
    copy_floor = statistics.median(r["copy_floor_s"] for r in results["async"])
    async_stall_ratio = median_stall("async") / copy_floor
    command = "make bench  (or: .venv/bin/python -m bench.micro.checkpoint " + " ".join(sys.argv[1:]) + ")"
    common = {
        "model": f"GPT-2 n_layer={args.n_layer} n_embd={args.n_embd}, batch 16x128 bytes, CPU",
        "checkpoint_mb": round(results["s3"][0]["local_checkpoints_mb"] / 2, 1),
        "save_every_steps": args.save_steps,
        "max_steps": args.max_steps,
        "rounds": args.rounds,
        "steps_per_s": {m: [round(r["steps_per_s"], 3) for r in results[m]] for m in modes},
        "stall_ms": {m: [round(s * 1000, 1) for r in results[m] for s in r["stalls_s"]] for m in modes[1:]},
        "s3_server": "SeaweedFS on loopback, same machine (it competes with training for the CPU)",
        **machine_details(),
    }
    write_result(
        "checkpoint_stall",
        stall_ratio,
        "<= 1.10",
        "plain local HF save of the same state (save_steps, no S3 callback)",
        command,
        {**common, "median_stall_ms": {m: round(median_stall(m) * 1000, 1) for m in modes[1:]}},
    )
    write_result(
        "checkpoint_throughput",
        throughput_ratio,
        ">= 0.99",
        "the same training with no checkpoints at all (async saves + S3 vs none)",
        command,
        {
            **common,
            "median_steps_per_s": {m: round(median_steps(m), 3) for m in modes},
            "sync_s3_vs_none": round(median_steps("s3") / median_steps("none"), 4),
            "async_dir_vs_none": round(median_steps("async-dir") / median_steps("none"), 4),
        },
    )
    write_result(
        "checkpoint_async_stall",
        async_stall_ratio,
        "<= 3",
        "the copy floor: the same model and optimizer tensors copied once more into warm host buffers, alone",
        command,
        {
            **common,
            "median_stall_ms": {m: round(median_stall(m) * 1000, 1) for m in modes[1:]},
            "copy_floor_ms": [round(r["copy_floor_s"] * 1000, 1) for r in results["async"]],
        },
    )
    s3_ms, local_ms, async_ms = (median_stall(m) * 1000 for m in ("s3", "local", "async"))
    print(f"\ncheckpoint_stall       {stall_ratio:.3f}  (goal <= 1.10; s3 {s3_ms:.0f} ms vs local {local_ms:.0f} ms)")
    async_speed, s3_speed, none_speed = median_steps("async"), median_steps("s3"), median_steps("none")
    print(
        f"checkpoint_throughput  {throughput_ratio:.3f}  (goal >= 0.99; async {async_speed:.2f}, "
        f"sync s3 {s3_speed:.2f}, async to a directory {median_steps('async-dir'):.2f}, none {none_speed:.2f} steps/s)"
    )
    print(
        f"checkpoint_async_stall {async_stall_ratio:.2f}  (goal <= 3; async {async_ms:.0f} ms "
        f"vs copy floor {copy_floor * 1000:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
