"""The ``spotray`` command: argparse wiring only; each command lives in its own module.

Command modules are imported when their command runs, so ``spotray --help`` or ``spotray
checkpoints`` never pay for torch, Ray or the kubernetes client they do not use.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import spotray
from spotray.cli.cluster_options import KubeOptions, add_cluster_flags
from spotray.cli.completion import SHELLS, completion_script
from spotray.cli.exit_codes import NotFoundError, exit_code_for
from spotray.cli.output import FORMATS
from spotray.contract.attempts import EXIT_INTERRUPTED, EXIT_OK
from spotray.contract.errors import SpotrayError
from spotray.contract.extras import extra_required

RUN_HELP = (
    "a TrainingRun manifest (its spec.checkpoint.uri is used), a checkpoint URI (s3://BUCKET/PREFIX, "
    "/path, file:///path), or the name of a TrainingRun in the kube context"
)

MAIN_EPILOG = """commands by where they run:
  on this machine   run FILE --local
  anywhere          validate FILE...
  on a cluster      submit (= run without --local), status, watch, logs, suspend, resume, delete
  on S3             checkpoints, pull, plot  (RUN: manifest, checkpoint URI, or TrainingRun name)

environment:
  AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3, S3_ENDPOINT_URL), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  AWS_REGION          S3 endpoint and credentials for checkpoints, pull and plot (and run --local)
  KUBECONFIG          the kube config for cluster commands (or --kubeconfig, --context, -n)

exit codes:
  0    ok (watch, submit --watch and run --local: the run succeeded)
  1    failed: the run failed, a checkpoint is incomplete or corrupt, S3 or the cluster refused
  2    bad input: a manifest, URI or flag is wrong (the message lists what to change)
  3    not found: no such run, checkpoint, attempt or bucket
  130  interrupted (Ctrl-C)

Errors are printed as the problem and, on the next line, the fix. `spotray COMMAND --help` has examples.
"""

RUN_EXAMPLES = """examples:
  spotray run jobs/gpt2/trainingrun.yaml --local
  spotray run jobs/gpt2/trainingrun.yaml --local --kill-worker-at 40     # a worker dies: Ray replaces it
  spotray run jobs/gpt2/trainingrun.yaml --local --kill-all-at 120       # the head dies: a new attempt resumes
  spotray run jobs/gpt2/trainingrun.yaml --local --preempt-at 80         # spot notice: emergency checkpoint
  spotray run jobs/gpt2/trainingrun.yaml --local --lose-worker-at 60 --add-worker-at 90s
                                       # a worker's node vanishes, and returns 90 s later
  spotray run jobs/gpt2/trainingrun.yaml --local --lose-worker-at 60 --add-worker-at 90s \\
      --worker-notice-s 30             # the same, with a 30 s spot notice first
  spotray run jobs/gpt2/trainingrun.yaml                                 # on the cluster: same as submit
  spotray run jobs/gpt2/sweep.yaml --local     # a TrainingSweep: its trials as local runs (docs/sweeps.md)

Without AWS_ENDPOINT_URL set, local mode starts its own S3 server (SeaweedFS) and keeps its data in
the work directory, so running the same command again resumes from the last checkpoint.

With --lose-worker-at, one worker runs on a Ray node of its own (127.0.0.3), which is SIGKILLed at
that step: an elastic run (spec.workers.minReplicas below replicas) goes on with the workers left
and grows back when the node returns; a fixed-size run waits for it. A loss may also come some
seconds after the node came up (90s). --add-worker-at gives when it returns: a step (elastic runs
only) or seconds after each loss (90s). Both take lists: 60,300. With --worker-notice-s 30 each loss
comes with a spot notice: the node is drained as a pod's preStop hook does it, then stopped; an
elastic run checkpoints and goes on without it at once, a fixed-size run stops on that checkpoint.
"""

SUBMIT_EXAMPLES = """examples:
  spotray submit jobs/gpt2/trainingrun.yaml              # create, or update if it exists
  spotray submit jobs/gpt2/trainingrun.yaml --watch      # and follow it until it ends
  spotray submit run.yaml -n team-a --context prod

The manifest is validated here first: a bad one is refused with every problem listed, and nothing
is sent. With --watch the exit code is the run's (0 succeeded, 1 failed).
"""

COMPLETION_EXAMPLES = """examples:
  source <(spotray completion bash)      # in this shell; put it in ~/.bashrc to keep it
  spotray completion bash > ~/.local/share/bash-completion/completions/spotray
  source <(spotray completion zsh)
"""

VALIDATE_EXAMPLES = """examples:
  spotray validate jobs/gpt2/trainingrun.yaml
  spotray validate runs/*.yaml          # every file; exit 2 if any is not valid

The same checks the API server makes through the CRD, plus what only spotray knows (a bucket name,
a Secret reference); `run` and `submit` make them too before they send anything.
"""

ACTION_EXAMPLES = """examples:
  spotray {verb} gpt2
  spotray {verb} gpt2 -n team-a --context prod
"""

STATUS_EXAMPLES = """examples:
  spotray status                       # every TrainingRun in the namespace, like kubectl get
  spotray status gpt2                  # one run: attempts, last checkpoint, conditions, message
  spotray status -o json | jq '.[] | select(.phase == "Running") | .name'
  spotray status gpt2 -o yaml          # the whole TrainingRun object
  spotray status -A                    # the runs of every namespace
"""

WATCH_EXAMPLES = """examples:
  spotray watch gpt2
  spotray watch gpt2 -n team-a && spotray pull gpt2 -n team-a ./gpt2-final

Polls the run's status every 2 s. Exits 0 when it succeeds, 1 when it fails; Ctrl-C stops only
the watching.
"""

LOGS_EXAMPLES = """examples:
  spotray logs gpt2                    # the current attempt's driver log
  spotray logs gpt2 -f                 # as it comes, attempt after attempt, until the run ends
  spotray logs gpt2 --attempt 1        # an earlier attempt's, while its RayJob still exists
  spotray logs gpt2 -n team-a --dashboard http://localhost:8265   # from Ray's jobs API instead

The log is the attempt's submitter pod's (KubeRay's K8sJobMode, the chart's default: it submits the
job and prints the driver's log), read through the Kubernetes API as `kubectl logs` does: no
port-forward, no token, only the right to read pods/log in the run's namespace. With --dashboard (or
a controller in HTTPMode, which has no submitter pod) it comes from Ray's jobs API on the attempt's
Ray head instead: reachable only inside the cluster unless you port-forward it (the error says
which service), and with Ray's token auth on (the chart's rayTokenAuth.enabled) it wants the
cluster's token in RAY_AUTH_TOKEN, kept by KubeRay in a Secret named after the RayCluster.
A preempted attempt's logs go with its RayJob.
"""

CHECKPOINTS_EXAMPLES = """examples:
  spotray checkpoints s3://my-bucket/runs/gpt2
  spotray checkpoints jobs/gpt2/trainingrun.yaml
  spotray checkpoints gpt2 -n team-a -o json

Newest first. A checkpoint is complete when its manifest is there and every file it lists has the
listed size; an incomplete one says why (usually: its upload was cut off by a preemption).
S3 endpoint and credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
"""

PULL_EXAMPLES = """examples:
  spotray pull gpt2 ./gpt2-final                         # the newest complete checkpoint
  spotray pull s3://my-bucket/runs/gpt2 --step 400 ./gpt2-400
  spotray pull jobs/gpt2/trainingrun.yaml ./model

Every file is checked against the checkpoint's manifest (size and SHA-256). The download lands in a
hidden directory next to DIR and is renamed to DIR only when verified, so DIR is never half there.
An incomplete or corrupt checkpoint is refused (exit code 1). DIR must not exist or be empty.
S3 endpoint and credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
"""

PLOT_EXAMPLES = """examples:
  spotray plot gpt2                                      # writes gpt2-loss.png
  spotray plot s3://my-bucket/runs/gpt2 --output loss.png
  spotray plot gpt2-lr                                   # a TrainingSweep: every trial, gpt2-lr-sweep.png

Joins the (step, loss) points every attempt kept in _spotray/attempt-N.progress.json next to the
checkpoints, and marks where each attempt resumed and where the one before it stopped. For a
TrainingSweep's name: every trial's curve, each stop at a rung and promotion marked.
S3 endpoint and credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
"""


# ------------------------------------------------------------------------------------ commands
# Each imports its module when it runs (see the module docstring), hence the PLC0415 waivers.


def run_command(args: argparse.Namespace) -> int:
    from spotray.contract.names import SWEEP_KIND  # noqa: PLC0415
    from spotray.contract.spec import read_manifest  # noqa: PLC0415

    document = read_manifest(args.file)
    if isinstance(document, dict) and document.get("kind") == SWEEP_KIND:
        return run_sweep(args, document)
    if not args.local:
        injected = [flag for flag in LOCAL_FAULT_FLAGS if getattr(args, flag.lstrip("-").replace("-", "_"))]
        if injected:
            raise SpotrayError(
                f"{', '.join(injected)} injects faults into a local run, and this run goes to the cluster",
                "add --local, or drop the fault flags (on a cluster, spot machines bring their own)",
            )
        if args.fresh_ray_cluster:
            raise SpotrayError(
                "--fresh-ray-cluster chooses local mode's Ray cluster, and this run goes to the cluster",
                "add --local, or drop --fresh-ray-cluster",
            )
        # Said before anything is sent: `run FILE` alone goes to whatever cluster the kube config names.
        print(
            "spotray: no --local, so this goes to the cluster of your kube context (as `spotray submit`); "
            "add --local to run it on this machine",
            file=sys.stderr,
        )
        return submit_command(args)
    from spotray.contract.spec import load_training_run  # noqa: PLC0415

    with extra_required("ray"):  # local mode runs Ray Train here: torch, transformers and Ray
        from spotray.local.local_run import Faults, LocalRun  # noqa: PLC0415
        from spotray.local.node_faults import NodeSchedule  # noqa: PLC0415
        from spotray.local.progress import ProgressView  # noqa: PLC0415

    training_run = load_training_run(args.file)
    workdir = args.workdir or Path("spotray-local") / training_run.name
    faults = Faults(
        kill_worker_at=args.kill_worker_at,
        kill_all_at=args.kill_all_at,
        preempt_at=args.preempt_at,
        nodes=NodeSchedule.from_flags(args.lose_worker_at, args.add_worker_at, args.worker_notice_s),
    )
    progress = ProgressView()
    progress.note(f"spotray: running TrainingRun {training_run.name!r} locally; logs and data in {workdir}")
    stop_like_ctrl_c()
    return LocalRun(training_run, workdir, faults, progress=progress, keep_ray_cluster=not args.fresh_ray_cluster).run()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
LOCAL_FAULT_FLAGS = (
    "--kill-worker-at",
    "--kill-all-at",
    "--preempt-at",
    "--lose-worker-at",
    "--add-worker-at",
    "--worker-notice-s",
)


def run_sweep(args: argparse.Namespace, document: dict[str, object]) -> int:
    """A TrainingSweep: its trials as local runs (docs/sweeps.md)."""
    from spotray.contract.sweep import parse_sweep  # noqa: PLC0415

    sweep = parse_sweep(document, where=str(args.file))
    flags = (*LOCAL_FAULT_FLAGS, "--fresh-ray-cluster")
    injected = [flag for flag in flags if getattr(args, flag.lstrip("-").replace("-", "_"))]
    if injected:
        raise SpotrayError(
            f"{', '.join(injected)} applies to one local run, and {args.file} is a sweep of runs",
            "drop the fault flags, or run one trial's manifest (<workdir>/<sweep>-tN.yaml) with them",
        )
    if not args.local:
        return submit_command(args)  # the controller runs its trials (controller/sweep_reconcile.py)
    with extra_required("ray"):
        from spotray.local.local_sweep import LocalSweep  # noqa: PLC0415
        from spotray.local.progress import ProgressView  # noqa: PLC0415

    workdir = args.workdir or Path("spotray-local") / sweep.name
    progress = ProgressView()
    progress.note(f"spotray: running TrainingSweep {sweep.name!r} locally; trials and their logs in {workdir}")
    stop_like_ctrl_c()
    return LocalSweep(sweep, workdir, progress=progress).run()


def stop_like_ctrl_c() -> None:
    """`kill`, `timeout` (SIGTERM) and a closed terminal (SIGHUP) stop a local run as Ctrl-C does: an
    emergency checkpoint, then every process local mode started is stopped."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def submit_command(args: argparse.Namespace) -> int:
    from spotray.cli.submit import submit_command as submit  # noqa: PLC0415

    return submit(args.file, KubeOptions.from_args(args), watch=args.watch)


def status_command(args: argparse.Namespace) -> int:
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
    from spotray.cli.run_status import status_command as status  # noqa: PLC0415

    if args.all_namespaces and args.run is not None:
        raise SpotrayError("-A lists the runs of every namespace, and RUN names one", "drop -A, or RUN")
    cluster = ClusterConnection(KubeOptions.from_args(args))
    return status(cluster, args.run, args.output, all_namespaces=args.all_namespaces)


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    print(completion_script(parser, shell), end="")
    return EXIT_OK


def validate_command(args: argparse.Namespace) -> int:
    from spotray.cli.run_actions import validate_command as validate  # noqa: PLC0415

    return validate(args.files)


def delete_command(args: argparse.Namespace) -> int:
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
    from spotray.cli.run_actions import delete_command as delete  # noqa: PLC0415

    return delete(ClusterConnection(KubeOptions.from_args(args)), args.run)


def suspend_command(args: argparse.Namespace) -> int:
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
    from spotray.cli.run_actions import suspend_command as suspend  # noqa: PLC0415

    return suspend(ClusterConnection(KubeOptions.from_args(args)), args.run, args.command == "suspend")


def watch_command(args: argparse.Namespace) -> int:
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
    from spotray.cli.watch import watch_run  # noqa: PLC0415

    return watch_run(ClusterConnection(KubeOptions.from_args(args)), args.run)


def logs_command(args: argparse.Namespace) -> int:
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
    from spotray.cli.logs import logs_command as logs  # noqa: PLC0415

    cluster = ClusterConnection(KubeOptions.from_args(args))
    return logs(cluster, args.run, args.attempt, args.dashboard, follow=args.follow)


def checkpoints_command(args: argparse.Namespace) -> int:
    from spotray.cli.checkpoint_commands import list_command  # noqa: PLC0415
    from spotray.cli.target import locate_run  # noqa: PLC0415

    return list_command(locate_run(args.run, KubeOptions.from_args(args)), args.output)


def pull_command(args: argparse.Namespace) -> int:
    from spotray.cli.checkpoint_commands import pull_command as pull  # noqa: PLC0415
    from spotray.cli.target import locate_run  # noqa: PLC0415

    return pull(locate_run(args.run, KubeOptions.from_args(args)), args.step, args.dir)


def plot_command(args: argparse.Namespace) -> int:
    from spotray.cli.loss_plot import plot_command as plot  # noqa: PLC0415
    from spotray.cli.loss_plot import plot_sweep_command  # noqa: PLC0415
    from spotray.cli.target import RUN_NAME, locate_run  # noqa: PLC0415

    kube = KubeOptions.from_args(args)
    try:
        location = locate_run(args.run, kube)
    except NotFoundError as no_run:
        if not RUN_NAME.match(args.run):
            raise
        from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415

        return plot_sweep_command(ClusterConnection(kube), args.run, args.output, no_run)  # or a sweep's name
    return plot(location, args.output)


# -------------------------------------------------------------------------------------- parser


def _add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default="table", help="table for people, json or yaml for programs"
    )


def add_fault_flags(run: argparse.ArgumentParser) -> None:
    faults = run.add_argument_group("fault injection (local mode)")
    faults.add_argument("--kill-worker-at", type=int, metavar="STEP", help="SIGKILL one Ray Train worker at STEP")
    faults.add_argument("--kill-all-at", type=int, metavar="STEP", help="SIGKILL the driver and Ray cluster at STEP")
    faults.add_argument("--preempt-at", type=int, metavar="STEP", help="send the driver SIGTERM (spot notice) at STEP")
    faults.add_argument(
        "--lose-worker-at",
        metavar="WHEN",
        help="SIGKILL a worker's Ray node at steps (60,300) or seconds after it came up (90s)",
    )
    faults.add_argument(
        "--add-worker-at",
        metavar="WHEN",
        help="bring the lost node back: at steps (elastic runs) or seconds after each loss (90s)",
    )
    faults.add_argument(
        "--worker-notice-s",
        type=int,
        metavar="SECONDS",
        help="give each --lose-worker-at loss a spot notice this long: drained, then stopped (default: none)",
    )


def _add_store_commands(command: Callable[[str, str, str, str], argparse.ArgumentParser]) -> None:
    """``checkpoints``, ``pull`` and ``plot``: what reads a run's checkpoints and events in the store."""
    checkpoints = command(
        "checkpoints",
        "list a run's checkpoints, complete or not",
        "A run's checkpoints, newest first, with size, file count and whether each is complete (and why not).",
        CHECKPOINTS_EXAMPLES,
    )
    checkpoints.add_argument("run", metavar="RUN", help=RUN_HELP)
    _add_output_flag(checkpoints)
    add_cluster_flags(checkpoints)
    checkpoints.set_defaults(handler=checkpoints_command)

    pull = command(
        "pull",
        "download a complete checkpoint, verified",
        "Download a complete checkpoint (the newest by default) into DIR, verified against its manifest.",
        PULL_EXAMPLES,
    )
    pull.add_argument("run", metavar="RUN", help=RUN_HELP)
    pull.add_argument("dir", type=Path, metavar="DIR", help="where the checkpoint's files go (must not exist yet)")
    pull.add_argument("--step", type=int, metavar="N", help="checkpoint-N instead of the newest complete one")
    add_cluster_flags(pull)
    pull.set_defaults(handler=pull_command)

    plot = command(
        "plot",
        "draw loss vs step across attempts (PNG)",
        "A PNG of training loss vs step across every attempt, with each resume marked (or of a sweep's trials).",
        PLOT_EXAMPLES,
    )
    plot.add_argument("run", metavar="RUN", help=RUN_HELP)
    # --output, not -o: -o is an output format everywhere else (status, checkpoints), as in kubectl.
    plot.add_argument("--output", type=Path, metavar="FILE.png", help="where to write it (default: RUN-loss.png)")
    add_cluster_flags(plot)
    plot.set_defaults(handler=plot_command)


def _add_validate(command: Callable[[str, str, str, str], argparse.ArgumentParser]) -> None:
    validate = command(
        "validate",
        "check manifests without a cluster: every problem at once",
        "Check TrainingRun and TrainingSweep manifests as run and submit do before they send anything: "
        "every problem of every file at once, with 'did you mean' for a misspelt field. No cluster needed.",
        VALIDATE_EXAMPLES,
    )
    validate.add_argument("files", type=Path, nargs="+", metavar="FILE", help="manifests (YAML)")
    validate.set_defaults(handler=validate_command)


def _add_run_actions(command: Callable[[str, str, str, str], argparse.ArgumentParser]) -> None:
    """``delete``, ``suspend`` and ``resume``: one RUN and the cluster flags each."""
    for name, summary, description in (
        (
            "delete",
            "delete a TrainingRun or TrainingSweep (its checkpoints stay)",
            "Delete a TrainingRun, or a TrainingSweep and its trials. Checkpoints stay in the store: applying "
            "the same manifest again resumes from the newest.",
        ),
        (
            "suspend",
            "stop a run after a checkpoint (spec.suspend: true)",
            "Set spec.suspend: the controller stops the current attempt after a checkpoint; nothing is spent.",
        ),
        (
            "resume",
            "start a suspended run again (spec.suspend: false)",
            "Clear spec.suspend: the next attempt resumes from the newest complete checkpoint.",
        ),
    ):
        verb = command(name, summary, description, ACTION_EXAMPLES.format(verb=name))
        verb.add_argument(
            "run", metavar="RUN", help="a TrainingRun's name" + (" or a sweep's" if name == "delete" else "")
        )
        add_cluster_flags(verb)
        verb.set_defaults(handler=delete_command if name == "delete" else suspend_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotray",
        description="Resumable training on spot machines with Ray and Kubernetes.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"spotray {spotray.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str, epilog: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=description,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    run = command(
        "run",
        "run a TrainingRun manifest here (--local) or on the cluster",
        "Run a TrainingRun manifest. With --local: on this machine, no cluster needed. "
        "Without: submit it to the cluster in the current kube context (as `spotray submit`).",
        RUN_EXAMPLES,
    )
    run.add_argument("file", type=Path, help="a TrainingRun manifest (YAML), or a TrainingSweep's with --local")
    run.add_argument("--local", action="store_true", help="run on this machine (local Ray, embedded S3)")
    run.add_argument("--watch", action="store_true", help="(cluster) follow the run until it ends")
    run.add_argument(
        "--workdir", type=Path, default=None, help="logs, events and local S3 data (default: spotray-local/RUN)"
    )
    run.add_argument(
        "--fresh-ray-cluster",
        action="store_true",
        help="local mode: a new Ray cluster for every attempt, even when the last one left it standing "
        "(slower; to compare, or to rule the kept cluster out)",
    )
    add_fault_flags(run)
    add_cluster_flags(run)
    run.set_defaults(handler=run_command)

    submit = command(
        "submit",
        "create or update a TrainingRun in the cluster",
        "Validate a TrainingRun manifest, then create it in the current kube context or update it (server-side "
        "apply, like kubectl apply).",
        SUBMIT_EXAMPLES,
    )
    submit.add_argument("file", type=Path, help="a TrainingRun manifest (YAML)")
    submit.add_argument("--watch", action="store_true", help="follow the run until it ends (exit code: the run's)")
    add_cluster_flags(submit)
    submit.set_defaults(handler=submit_command)

    _add_validate(command)

    status = command(
        "status",
        "list TrainingRuns, or show one in detail",
        "TrainingRuns with phase, attempt, progress, last checkpoint and preemptions; with RUN, one in detail.",
        STATUS_EXAMPLES,
    )
    status.add_argument("run", nargs="?", metavar="RUN", help="a TrainingRun's name (default: list them all)")
    status.add_argument(
        "-A", "--all-namespaces", action="store_true", help="list the runs of every namespace (a NAMESPACE column)"
    )
    _add_output_flag(status)
    add_cluster_flags(status)
    status.set_defaults(handler=status_command)

    watch = command(
        "watch",
        "follow a run's progress until it ends",
        "A live progress line for a TrainingRun on the cluster; says when an attempt is preempted and resumes.",
        WATCH_EXAMPLES,
    )
    watch.add_argument("run", metavar="RUN", help="a TrainingRun's name")
    add_cluster_flags(watch)
    watch.set_defaults(handler=watch_command)

    _add_run_actions(command)

    logs = command("logs", "print an attempt's job logs", "The driver log of one attempt's Ray job.", LOGS_EXAMPLES)
    logs.add_argument("run", metavar="RUN", help="a TrainingRun's name")
    logs.add_argument("--attempt", type=int, metavar="N", help="which attempt (default: the current one)")
    logs.add_argument("--dashboard", metavar="URL", help="ask this Ray dashboard instead, e.g. a port-forward's")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="print the log as it comes until the attempt (or the run) ends"
    )
    add_cluster_flags(logs)
    logs.set_defaults(handler=logs_command)

    _add_store_commands(command)
    completion = command(
        "completion",
        "print a shell completion script (bash, zsh)",
        "A completion script for bash or zsh, written from this parser: commands, flags, choices, and "
        "TrainingRun names from kubectl where a command takes one.",
        COMPLETION_EXAMPLES,
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    completion.set_defaults(handler=lambda args: _print_completion(parser, args.shell))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except SpotrayError as error:
        print(f"error: {error}", file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
