"""The ``spotray`` command.

    spotray run jobs/gpt2/trainingrun.yaml --local
    spotray run jobs/gpt2/trainingrun.yaml --local --kill-worker-at 40 --kill-all-at 120

Exit codes: 0 the run succeeded; 1 it failed (failures or preemptions beyond the retry budget);
2 bad input (the message names the problem and the fix); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spotray.local import Faults, LocalRun
from spotray.progress import ProgressView
from train.errors import SpotrayError
from train.runspec import load_training_run

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

RUN_EXAMPLES = """examples:
  spotray run jobs/gpt2/trainingrun.yaml --local
  spotray run jobs/gpt2/trainingrun.yaml --local --kill-worker-at 40     # a worker dies: Ray replaces it
  spotray run jobs/gpt2/trainingrun.yaml --local --kill-all-at 120       # the head dies: a new attempt resumes
  spotray run jobs/gpt2/trainingrun.yaml --local --preempt-at 80         # spot notice: emergency checkpoint

Without AWS_ENDPOINT_URL set, local mode starts its own S3 server (SeaweedFS) and keeps its data in
the work directory, so running the same command again resumes from the last checkpoint.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotray", description="Resumable training on spot machines with Ray and Kubernetes."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a TrainingRun manifest",
        description="Run a TrainingRun manifest. With --local: on this machine, no cluster needed.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("file", type=Path, help="a TrainingRun manifest (YAML)")
    run.add_argument("--local", action="store_true", help="run on this machine (local Ray, embedded S3)")
    run.add_argument(
        "--workdir", type=Path, default=None, help="logs, events and local S3 data (default: spotray-local/RUN)"
    )
    faults = run.add_argument_group("fault injection (local mode)")
    faults.add_argument("--kill-worker-at", type=int, metavar="STEP", help="SIGKILL one Ray Train worker at STEP")
    faults.add_argument("--kill-all-at", type=int, metavar="STEP", help="SIGKILL the driver and Ray cluster at STEP")
    faults.add_argument("--preempt-at", type=int, metavar="STEP", help="send the driver SIGTERM (spot notice) at STEP")
    return parser


def run_command(args: argparse.Namespace) -> int:
    if not args.local:
        raise SpotrayError(
            "`spotray run` without --local would submit to a cluster, which is not built yet",
            "add --local to run on this machine, or `kubectl apply -f FILE` on a cluster with the spotray chart",
        )
    training_run = load_training_run(args.file)
    workdir = args.workdir or Path("spotray-local") / training_run.name
    faults = Faults(kill_worker_at=args.kill_worker_at, kill_all_at=args.kill_all_at, preempt_at=args.preempt_at)
    progress = ProgressView()
    progress.note(f"spotray: running TrainingRun {training_run.name!r} locally; logs and data in {workdir}")
    return LocalRun(training_run, workdir, faults, progress=progress).run()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except SpotrayError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
