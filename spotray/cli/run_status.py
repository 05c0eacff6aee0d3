"""``spotray status [NAME]``: the runs in a namespace as a table, or one run (or sweep) in detail.

Everything shown comes from the TrainingRun's status, which the controller keeps up to date:
phase, attempt, progress, the last complete checkpoint, preemptions, failures, and the history
of attempts with how each ended. A TrainingSweep's NAME shows the sweep's status and each trial:
its values, how far it got, its objective at each rung, and what the sweep decided for it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotray.cli.exit_codes import NotFoundError
from spotray.cli.output import age_since, emit, human_bytes, render_data, render_table
from spotray.contract.attempts import EXIT_OK
from spotray.contract.names import SWEEP_KIND, SWEEP_LABEL
from spotray.contract.status import (
    AttemptStartup,
    AttemptStatus,
    CheckpointInterval,
    Cost,
    Goodput,
    LastCheckpoint,
    Progress,
    RunStatus,
)
from spotray.contract.sweep import (
    EXPLOIT_ANNOTATION,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
    Exploit,
    pending_exploit,
    trial_lineage,
)
from spotray.train.records.goodput import lost_time_summary

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection

COLUMNS = ("name", "phase", "attempt", "step", "loss", "checkpoint", "preemptions", "failures", "goodput", "age")


def sweep_and_trials(
    cluster: ClusterConnection, name: str, no_run: NotFoundError
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """NAME is no TrainingRun: the TrainingSweep of that name and its trials, or ``no_run`` raised (whose
    fix says how to list runs). For ``spotray status`` and ``spotray plot``."""
    try:
        sweep = cluster.get_run(name, kind=SWEEP_KIND)
    except NotFoundError:
        raise no_run from None
    return sweep, cluster.list_runs(labels={SWEEP_LABEL: name})


def _sweep_status(cluster: ClusterConnection, name: str, fmt: str, no_run: NotFoundError) -> int:
    sweep, trials = sweep_and_trials(cluster, name, no_run)
    if fmt == "table":
        emit(describe_sweep(sweep, trials))
    else:
        emit(render_data({"sweep": sweep, "trials": trials}, fmt))
    return EXIT_OK


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The table's row as data, for ``-o json|yaml`` (its keys are this command's output, which scripts read)."""
    status = RunStatus.of(run)
    progress = status.progress or Progress()
    return {
        "name": run["metadata"]["name"],
        "namespace": run["metadata"].get("namespace"),
        "phase": status.phase,
        "attempt": status.attempt,
        "step": progress.step,
        "totalSteps": progress.total_steps,
        "loss": progress.loss,
        "lastCheckpointStep": status.last_checkpoint.step if status.last_checkpoint else None,
        "preemptions": status.preemptions or 0,
        "failures": status.failures or 0,
        "goodput": status.goodput.ratio if status.goodput else None,
        "created": run["metadata"].get("creationTimestamp"),
    }


def _dash(value: object) -> object:
    return "-" if value is None else value


def _step(step: int | None, total: int | None) -> str:
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def _loss(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4g}"


def status_table(runs: list[dict[str, Any]], now: datetime | None = None, *, with_namespace: bool = False) -> str:
    """``kubectl get``'s table; with ``with_namespace`` (``-A``) a NAMESPACE column first, as kubectl adds."""
    rows = []
    for run in runs:
        row = run_summary(run)
        rows.append(
            (
                *((row["namespace"],) if with_namespace else ()),
                row["name"],
                row["phase"] or "-",
                _dash(row["attempt"]),
                _step(row["step"], row["totalSteps"]),
                _loss(row["loss"]),
                _dash(row["lastCheckpointStep"]),
                row["preemptions"],
                row["failures"],
                "-" if row["goodput"] is None else f"{row['goodput']:.2f}",
                age_since(row["created"], now),
            )
        )
    return render_table((("namespace",) if with_namespace else ()) + COLUMNS, rows)


def goodput_line(goodput: Goodput) -> str:
    """status.goodput in words: the ratio, the surviving time, the lost time by cause (biggest first)."""
    redone = goodput.steps_redone or ()
    # By cause under its status key ("waitingForCapacity 400 s"), as docs/goodput.md names them.
    lost = goodput.lost_seconds.to_status() if goodput.lost_seconds else {}
    return (
        f"{goodput.ratio or 0:.2f} ({goodput.surviving_step_seconds or 0} s of "
        f"{goodput.wall_seconds or 0} s in steps that survived; lost: "
        + lost_time_summary(lost)
        + (f"; steps redone after each resume: {', '.join(map(str, redone))}" if redone else "")
        + ")"
    )


def cost_line(cost: Cost) -> str:
    """status.cost in words: the run's cost so far beside an on-demand run of the same steps."""
    currency = f" {cost.currency}" if cost.currency else ""
    saved = cost.saved_ratio
    return (
        f"{cost.run or 0:.2f}{currency} so far; on demand, the same steps: "
        f"{cost.on_demand_same_steps or 0:.2f}{currency}"
        + (f" (spot saved {saved:.0%})" if saved is not None and saved >= 0 else "")
        + (f" (spot cost {-saved:.0%} more)" if saved is not None and saved < 0 else "")
        + (f"; {cost.on_demand_seconds} s of it on on-demand nodes" if cost.on_demand_seconds else "")
    )


def interval_line(chosen: CheckpointInterval) -> str:
    """status.checkpointInterval in words: the interval and the numbers it came from."""
    if chosen.target_seconds is None:
        return f"every {chosen.steps} steps (auto: the shortest allowed, until a checkpoint's cost is measured)"
    return (
        f"every {chosen.steps} steps (auto: sqrt(2 x {chosen.checkpoint_seconds} s per checkpoint x "
        f"{chosen.mean_seconds_between_interruptions:.0f} s between interruptions) = "
        f"{chosen.target_seconds:.0f} s at {chosen.step_seconds} s a step; "
        f"{chosen.interruptions} interruption(s) in {chosen.observed_seconds or 0:.0f} s seen; "
        f"bounds {chosen.min_steps}-{chosen.max_steps})"
    )


def _ago(time: str | None, now: datetime) -> str:
    return f"{age_since(time, now)} ago" if time else "-"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def describe_run(run: dict[str, Any], now: datetime | None = None) -> str:
    """A ``kubectl describe``-like view of one run."""
    now = now or datetime.now(UTC)
    metadata = run["metadata"]
    status = RunStatus.of(run)
    progress = status.progress or Progress()
    checkpoint = status.last_checkpoint or LastCheckpoint()
    fields: list[tuple[str, object]] = [
        ("Name", metadata["name"]),
        ("Namespace", metadata.get("namespace")),
        ("Age", age_since(metadata.get("creationTimestamp"), now)),
        ("Phase", status.phase or "- (the controller has not seen it yet)"),
        ("Message", status.message),
        ("Attempt", f"{status.attempt} (RayJob {_dash(status.ray_job)})" if status.attempt else None),
    ]
    if progress.step is not None:
        rate = progress.steps_per_second
        fields.append(
            (
                "Progress",
                f"step {_step(progress.step, progress.total_steps)}, loss {_loss(progress.loss)}"
                + (f", {rate:.2f} steps/s" if rate else "")
                + f" (updated {_ago(progress.update_time, now)})",
            )
        )
    if progress.upload_stalled_since:
        fields.append(
            (
                "Uploads",
                f"stalled since {progress.upload_stalled_since} ({_ago(progress.upload_stalled_since, now)}): the "
                f"store answers {progress.upload_stall_fault or 'with a fault'}; checkpoints wait or are dropped "
                "until it answers",
            )
        )
    if checkpoint.step is not None:
        fields.append(
            ("Last checkpoint", f"step {checkpoint.step} at {_dash(checkpoint.uri)} ({_ago(checkpoint.time, now)})")
        )
    if status.checkpoint_interval:
        fields.append(("Checkpoints", interval_line(status.checkpoint_interval)))
    if status.goodput:
        fields.append(("Goodput", goodput_line(status.goodput)))
    if status.cost:
        fields.append(("Cost", cost_line(status.cost)))
    fields += [
        ("Preemptions", status.preemptions or 0),
        ("Failures", status.failures or 0),
        ("Next attempt", status.next_attempt_time),
    ]
    lines = [f"{key + ':':<17}{value}" for key, value in fields if value is not None]
    if status.attempts:
        rows = [
            (
                a.attempt,
                a.ray_job or "-",
                a.outcome or "-",
                a.reason or "-",
                a.capacity or "-",
                _dash(a.resumed_from),
                _startup(a.startup),
                _ago(a.start_time, now),
                _ago(a.end_time, now),
                a.message,
            )
            for a in status.attempts
        ]
        headers = (
            "attempt", "rayjob", "outcome", "reason", "capacity", "resumed from", "start-up", "started", "ended",
            "message",
        )  # fmt: skip
        lines += ["Attempts:", _indent(render_table(headers, rows))]
        # Checkpoints an attempt did not resume from although they were newer (issue #69): said, with why.
        lines += [
            f"  attempt {a.attempt} passed over {skipped}"
            for a in status.attempts
            for skipped in a.skipped_checkpoints or ()
        ]
        lines += [_resume_read_line(a) for a in status.attempts if a.resume_read is not None]
    if status.conditions:
        condition_rows = [
            (c.type, c.status, c.reason, _ago(c.last_transition_time, now), c.message) for c in status.conditions
        ]
        condition_headers = ("type", "status", "reason", "changed", "message")
        lines += ["Conditions:", _indent(render_table(condition_headers, condition_rows))]
    return "\n".join(lines)


def _resume_read_line(attempt: AttemptStatus) -> str:
    """Where a resume on several nodes read its checkpoint: "attempt 2 read checkpoint-20 on 4 nodes: ..."."""
    read = attempt.resume_read
    assert read is not None
    start = f"checkpoint-{attempt.resumed_from}" if attempt.resumed_from is not None else "its checkpoint"
    completed = (
        f"; {start} completed in S3 from the nodes' copies ({human_bytes(read.completed_bytes)} uploaded)"
        if read.completed_bytes
        else ""
    )
    return (
        f"  attempt {attempt.attempt} read {start} on {read.nodes} nodes: {human_bytes(read.s3_bytes)} from S3, "
        f"{human_bytes(read.kept_bytes)} from the nodes' copies, {human_bytes(read.peer_bytes)} sent between nodes"
        f"{completed}"
    )


def _startup(startup: AttemptStartup | None) -> str:
    """An attempt's start-up milestones, in seconds after its RayJob: "pods 18s, loop 50s, step 51s"."""
    if startup is None:
        return "-"
    milestones = (("pods", startup.pods_ready), ("loop", startup.training_loop), ("step", startup.first_step))
    return ", ".join(f"{name} {seconds:.0f}s" for name, seconds in milestones if seconds is not None) or "-"


TRIAL_COLUMNS = ("trial", "values", "phase", "step", "objective at rungs", "sweep", "preemptions", "failures")


def _decision(annotations: dict[str, Any]) -> str:
    if STOPPED_ANNOTATION in annotations:
        return f"stopped at {annotations[STOPPED_ANNOTATION]}"
    if PROMOTED_ANNOTATION in annotations:
        return f"past {annotations[PROMOTED_ANNOTATION]}"
    if EXPLOIT_ANNOTATION in annotations:
        exploit = pending_exploit(annotations)
        return f"exploiting {_exploit_text(exploit) if exploit else '(unreadable)'}"
    if lineage := trial_lineage(annotations):
        return "exploited " + "; ".join(_exploit_text(exploit) for exploit in lineage)
    return "-"


def _exploit_text(exploit: Exploit) -> str:
    """An exploit of population-based training in a few words: t<donor>@<its step> at <step>, new values."""
    values = " ".join(f"{name}={value}" for name, value in exploit.values.items())
    return f"t{exploit.donor}@{exploit.donor_step} at {exploit.step} ({values})"


def _best(best: dict[str, Any]) -> str:
    if not best:
        return "- (no trial has succeeded yet)"
    objective = ", ".join(f"{key} {_loss(value)}" for key, value in best.items() if key != "trial")
    return f"trial {best.get('trial')} ({objective})"


def _gpu_hours(spent: Any, trials: dict[str, Any]) -> str:
    """What the trials spent, and of what budget (spec.trials.maxGpuHours), if the sweep has one."""
    budget = trials.get("maxGpuHours")
    return f"{_dash(spent)} spent" + (f" of {budget}" if budget is not None else " (no budget)")


def describe_sweep(sweep: dict[str, Any], trials: list[dict[str, Any]], now: datetime | None = None) -> str:
    """A TrainingSweep and its trials, from the sweep's status and each trial's TrainingRun."""
    status = sweep.get("status") or {}
    best = status.get("best") or {}
    counts = ", ".join(f"{n} {state}" for state, n in (status.get("trials") or {}).items() if n) or "none"
    lines = [
        f"Name:      {sweep['metadata']['name']} (TrainingSweep, namespace {sweep['metadata'].get('namespace')})",
        f"Phase:     {status.get('phase') or '-'}",
        f"Trials:    {_dash(status.get('started'))} of {_dash(status.get('limit'))} started ({counts})",
        f"Best:      {_best(best)}",
        f"GPU-hours: {_gpu_hours(status.get('gpuHours'), (sweep.get('spec') or {}).get('trials') or {})}",
        *([f"Exploits:  {status['exploits']} (population-based training)"] if "exploits" in status else []),
        f"Message:   {status.get('message') or '-'}",
        f"Age:       {age_since(sweep['metadata'].get('creationTimestamp'), now)}",
    ]
    rows = []
    for trial in trials:
        metadata = trial["metadata"]
        annotations = metadata.get("annotations") or {}
        run = RunStatus.of(trial)
        progress = run.progress or Progress()
        rungs = ", ".join(f"{e.step}: {_loss(e.loss)}" for e in run.interval_losses or ()) or "-"
        rows.append(
            (
                metadata["name"],
                annotations.get(PARAMS_ANNOTATION, "-"),
                run.phase or "-",
                _step(progress.step, progress.total_steps),
                rungs,
                _decision(annotations),
                run.preemptions or 0,
                run.failures or 0,
            )
        )
    if rows:
        lines += ["Trials:", _indent(render_table(TRIAL_COLUMNS, rows))]
    return "\n".join(lines)


def status_command(cluster: ClusterConnection, name: str | None, fmt: str, *, all_namespaces: bool = False) -> int:
    if name is not None:
        try:
            run = cluster.get_run(name)
        except NotFoundError as no_run:
            return _sweep_status(cluster, name, fmt, no_run)
        emit(describe_run(run) if fmt == "table" else render_data(run, fmt))
        return EXIT_OK
    runs = cluster.list_runs(all_namespaces=all_namespaces)
    if fmt != "table":
        emit(render_data([run_summary(run) for run in runs], fmt))
    elif runs:
        emit(status_table(runs, with_namespace=all_namespaces))
    else:
        where = "any namespace" if all_namespaces else f"namespace {cluster.namespace}"
        emit(f"no TrainingRuns in {where} (context {cluster.context_name})")
    return EXIT_OK
