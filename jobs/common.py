"""What every example job shares: run settings from ``SPOTRAY_RUN`` or, when started by hand, from flags.

A job started by the controller or by ``spotray run`` gets its run settings (checkpoint URI,
interval and retention, data URI, workers) from the TrainingRun in ``SPOTRAY_RUN``; started by hand,
from the flags in ``RUN_FLAGS``, each of which stands for one spec field and takes its default and
help from that field's declaration (spotray/contract/spec.py). Hyperparameters always come from the
job's own flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Self

from spotray.contract.attempts import new_run_id
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import (
    CheckpointSpec,
    DataSpec,
    InvalidSpecError,
    RunContext,
    RunSpec,
    WorkerSpec,
    camel,
    declaration,
    default_of,
    parse_spec,
)
from spotray.train.records.event_log import EVENTS_ENV


@dataclasses.dataclass(frozen=True)
class RunFlag:
    """A hand-start flag that stands for one spec field: its default and help are the field's."""

    flag: str
    section: type[Any]  # the spec section's dataclass
    field: str
    type: Callable[[str], Any] = str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def spec_path(self) -> str:
        """Where the value goes in a TrainingRun: ``spec.checkpoint.uri``."""
        return f"spec.{_SECTION_KEYS[self.section]}.{camel(self.field)}"

    def add_to(self, group: argparse._ArgumentGroup, help_text: str | None = None) -> None:
        declared = declaration(self.section, self.field).description
        first_sentence = declared.split(". ")[0].rstrip(".")
        group.add_argument(
            self.flag, type=self.type, default=default_of(self.section, self.field), help=help_text or first_sentence
        )


# The spec's sections by their dataclass: {CheckpointSpec: "checkpoint", WorkerSpec: "workers", ...}.
_SECTION_KEYS = {hint: camel(name) for name, hint in typing.get_type_hints(RunSpec).items() if is_dataclass(hint)}

CHECKPOINT_URI = RunFlag("--checkpoint-uri", CheckpointSpec, "uri")
DATA_URI = RunFlag("--data-uri", DataSpec, "uri")
WORKERS = RunFlag("--workers", WorkerSpec, "replicas", int)  # one Ray Train worker per pod on CPU
MIN_WORKERS = RunFlag("--min-workers", WorkerSpec, "min_replicas", int)
CPU_PER_WORKER = RunFlag("--cpu-per-worker", WorkerSpec, "cpu")
SAVE_STEPS = RunFlag("--save-steps", CheckpointSpec, "every_steps", int)
KEEP = RunFlag("--keep", CheckpointSpec, "keep", int)
RUN_FLAGS = (CHECKPOINT_URI, DATA_URI, WORKERS, MIN_WORKERS, CPU_PER_WORKER, SAVE_STEPS, KEEP)


def add_run_flags(
    parser: argparse.ArgumentParser, *, run_name: str, data_help: str, checkpoints_every_steps: bool = True
) -> None:
    flags = parser.add_argument_group("run settings when started by hand (SPOTRAY_RUN overrides them)")
    for flag in RUN_FLAGS:
        if flag is SAVE_STEPS and not checkpoints_every_steps:  # jobs that checkpoint per epoch
            continue
        flag.add_to(flags, data_help if flag is DATA_URI else None)
    flags.add_argument("--run-name", default=run_name, help="Ray run name (stable across attempts)")
    parser.add_argument("--create-bucket", action="store_true", help="create missing buckets")
    parser.add_argument("--events", type=Path, default=None, help="append JSON-lines progress events here")


def run_context(args: argparse.Namespace, *, workers: int | None = None) -> RunContext:
    """The run context from ``SPOTRAY_RUN``, else from the flags (torchrun passes its world size as ``workers``).

    The flags become a spec in its manifest form, read by the same ``parse_spec`` as a TrainingRun:
    a wrong value is reported with the flag's name.
    """
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
    given = {flag: getattr(args, flag.dest, None) for flag in RUN_FLAGS}
    if workers:  # under torchrun the world size is the run's size, never elastic
        given.update({WORKERS: workers, MIN_WORKERS: None})
    manifest: dict[str, Any] = {"entrypoint": " ".join(sys.argv)}
    for flag, value in given.items():
        if value is not None:
            manifest.setdefault(_SECTION_KEYS[flag.section], {})[camel(flag.field)] = value
    try:
        spec = parse_spec(manifest, where="the job's command line")
    except InvalidSpecError as error:
        problems = list(error.problems)
        for flag in RUN_FLAGS:
            problems = [problem.replace(f"{flag.spec_path}:", f"{flag.flag}:") for problem in problems]
        raise InvalidSpecError(problems, where="the job's command line") from None
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
    return Path(os.environ[EVENTS_ENV]) if os.environ.get(EVENTS_ENV) else None


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
