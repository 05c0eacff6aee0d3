"""What every example job shares: run settings from ``SPOTRAY_RUN`` or, when started by hand, from flags.

A job started by the controller or by ``spotray run`` gets its run settings (checkpoint URI,
interval and retention, data URI, workers) from the TrainingRun in ``SPOTRAY_RUN``; started by hand,
from the flags that ``add_run_flags`` adds. Hyperparameters always come from the job's own flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Self

from spotray.contract.attempts import new_run_id
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import CheckpointSpec, DataSpec, RunContext, RunSpec, WorkerSpec


def add_run_flags(
    parser: argparse.ArgumentParser, *, run_name: str, data_help: str, checkpoints_every_steps: bool = True
) -> None:
    flags = parser.add_argument_group("run settings when started by hand (SPOTRAY_RUN overrides them)")
    flags.add_argument("--checkpoint-uri", help="s3://bucket/prefix or file:///path for checkpoints")
    flags.add_argument("--data-uri", help=data_help)
    flags.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    flags.add_argument(
        "--min-workers",
        type=int,
        default=None,
        help="elastic: go on with as few as this many workers when some are lost (default: --workers)",
    )
    flags.add_argument("--cpu-per-worker", type=float, default=1.0)
    if checkpoints_every_steps:  # jobs that checkpoint per epoch have no use for it
        flags.add_argument("--save-steps", type=int, default=25, help="checkpoint every N steps")
    flags.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep in the store")
    flags.add_argument("--run-name", default=run_name, help="Ray run name (stable across attempts)")
    parser.add_argument("--create-bucket", action="store_true", help="create missing buckets")
    parser.add_argument("--events", type=Path, default=None, help="append JSON-lines progress events here")


def run_context(args: argparse.Namespace, *, workers: int | None = None) -> RunContext:
    """The run context from ``SPOTRAY_RUN``, else from the flags (torchrun passes its world size as ``workers``)."""
    from_env = RunContext.from_env()
    if from_env is not None:
        return from_env
    if not args.checkpoint_uri:
        raise SpotrayError(
            "no checkpoint URI: SPOTRAY_RUN is not set and --checkpoint-uri was not given",
            "pass --checkpoint-uri s3://BUCKET/PREFIX (and --data-uri), or start the job with `spotray run`",
        )
    min_workers = getattr(args, "min_workers", None)
    if min_workers is not None and not 1 <= min_workers <= args.workers:
        raise SpotrayError(
            f"--min-workers {min_workers} is outside 1..--workers ({args.workers})",
            "give --min-workers between 1 and --workers: the fewest workers the run goes on with",
        )
    spec = RunSpec(
        entrypoint=" ".join(sys.argv),
        checkpoint=CheckpointSpec(
            uri=args.checkpoint_uri, every_steps=getattr(args, "save_steps", CheckpointSpec.every_steps), keep=args.keep
        ),
        workers=WorkerSpec(
            replicas=workers or args.workers,
            cpu=str(args.cpu_per_worker),
            min_replicas=None if workers else min_workers,
        ),
        data=DataSpec(uri=args.data_uri),
    )
    # Started by hand: a run of its own, so no record of an earlier hand-started run is read as ours.
    return RunContext(name=args.run_name, run_id=new_run_id("manual"), attempt=1, spec=spec)


def worker_context() -> RunContext:
    """The run context inside a training worker: launch() (or the torchrun path) always exports it."""
    context = RunContext.from_env()
    if context is None:
        raise SpotrayError(
            "SPOTRAY_RUN is not set in this training worker",
            "start the job's main() (it exports the run context to every worker), not its train_loop alone",
        )
    return context


def required_data_uri(context: RunContext, job: str, what: str, example: str) -> str:
    if not context.spec.data.uri:
        raise SpotrayError(
            f"{job} needs a data URI for its {what} and none was given",
            f"set spec.data.uri in the TrainingRun (e.g. {example}) or pass --data-uri",
        )
    return context.spec.data.uri


def events_path(args: argparse.Namespace) -> Path | None:
    """``--events``, else ``SPOTRAY_EVENTS`` (set by local mode), else none."""
    if args.events:
        return Path(args.events)
    return Path(os.environ["SPOTRAY_EVENTS"]) if os.environ.get("SPOTRAY_EVENTS") else None


class LoopConfig:
    """A mixin for a job's frozen dataclass config: plain values for Ray to ship to the workers, and back.

    The config needs ``workdir: Path`` and ``events_path: Path | None`` fields.
    """

    def to_loop_config(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}

    @classmethod
    def from_loop_config(cls, data: dict[str, Any]) -> Self:
        events = data.get("events_path")
        return cls(**{**data, "workdir": Path(data["workdir"]), "events_path": Path(events) if events else None})
