"""Train a small GPT-2 (built from config) with Ray Train, streaming MDS shards from S3, resumable at any moment.

The job's settings: its flags and the config every Ray Train worker gets (jobs/gpt2/driver.py runs
the job, jobs/gpt2/train.py is what each worker runs). Light on purpose: the driver imports this,
and neither torch's model code nor transformers.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from spotray.contract.spec import RunContext
from spotray.jobs.common import LoopConfig, add_run_flags, events_path, required_data_uri
from spotray.train.checkpoints.save_policy import WHEN_BUSY_CHOICES
from spotray.train.launch.batching import check_batch_splits


@dataclass(frozen=True)
class Gpt2JobConfig(LoopConfig):
    """The job's own settings; the run's (checkpoint and data URIs, interval, keep, GPUs) are its RunContext."""

    workdir: Path
    max_steps: int = 400
    seed: int = 42
    batch_size: int = 16  # global: split across workers, so a resume with another worker count trains the same
    block_size: int = 128
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    learning_rate: float = 3e-3
    dropout: float = 0.1
    create_bucket: bool = False
    events_path: Path | None = None
    async_checkpoints: bool = (
        True  # the loop waits only for a copy to host memory (train/checkpoints/async_checkpoint.py)
    )
    when_busy: str = "wait"  # a save while the previous one is still being written: "wait" or "skip"
    min_step_seconds: float = 0.0  # a step lasts at least this long (see StepFloor)


def build_job_config(args: argparse.Namespace, context: RunContext) -> Gpt2JobConfig:
    required_data_uri(context, "spotray.jobs.gpt2", "MDS shards", "s3://BUCKET/datasets/gpt2-bytes")
    check_batch_splits(args.batch_size, context.spec.workers)
    return Gpt2JobConfig(
        # Absolute: Ray Train workers run in a directory of Ray's, not the driver's.
        workdir=(args.workdir / context.name).absolute(),
        max_steps=args.max_steps,
        seed=args.seed,
        batch_size=args.batch_size,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        learning_rate=args.learning_rate,
        dropout=args.dropout,
        create_bucket=args.create_bucket,
        events_path=events_path(args),
        async_checkpoints=args.checkpoint_mode == "async",
        when_busy=args.when_busy,
        min_step_seconds=args.min_step_seconds,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spotray.jobs.gpt2", description=__doc__.split("\n\n")[0])
    add_run_flags(parser, run_name="gpt2", data_help="where the MDS shards are (prepared there if missing)")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-gpt2", help="local scratch directory"
    )
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch size, split across workers")
    parser.add_argument("--n-layer", type=int, default=2, help="transformer blocks")
    parser.add_argument("--n-embd", type=int, default=128, help="embedding width (a multiple of 4 heads)")
    parser.add_argument(
        "--learning-rate", type=float, default=Gpt2JobConfig.learning_rate, help="AdamW's peak learning rate"
    )
    parser.add_argument(
        "--dropout", type=float, default=0.1, help="0 makes runs with different worker counts numerically equal"
    )
    parser.add_argument(
        "--checkpoint-mode",
        choices=("async", "sync"),
        default="async",
        help="async: a save blocks training only for a copy to host memory; sync: the Trainer's own save",
    )
    parser.add_argument(
        "--when-busy",
        choices=WHEN_BUSY_CHOICES,
        default="wait",
        help="async: a save that comes while the previous one is still being written waits for it, or is skipped",
    )
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="make each step last at least this long (a fault campaign's tiny model paced like a real one)",
    )
    args = parser.parse_args(argv)
    if args.min_step_seconds < 0:
        parser.error("--min-step-seconds must be >= 0")
    if not args.learning_rate > 0:
        parser.error("--learning-rate must be > 0")
    for name in ("max_steps", "save_steps", "keep", "batch_size", "n_layer", "n_embd", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args
