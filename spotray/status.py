"""``spotray status [RUN]``: the runs in a namespace as a table, or one run in detail.

Everything shown comes from the TrainingRun's status, which the controller keeps up to date:
phase, attempt, progress, the last complete checkpoint, preemptions, failures, and the history
of attempts with how each ended.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotray.output import age_since, emit, render_data, render_table
from spotray.train.records.goodput import lost_time_summary

if TYPE_CHECKING:
    from spotray.kube import ClusterConnection

COLUMNS = ("name", "phase", "attempt", "step", "loss", "checkpoint", "preemptions", "failures", "goodput", "age")


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The table's row as data, for ``-o json|yaml``."""
    status = run.get("status") or {}
    progress = status.get("progress") or {}
    checkpoint = status.get("lastCheckpoint") or {}
    return {
        "name": run["metadata"]["name"],
        "namespace": run["metadata"].get("namespace"),
        "phase": status.get("phase"),
        "attempt": status.get("attempt"),
        "step": progress.get("step"),
        "totalSteps": progress.get("totalSteps"),
        "loss": progress.get("loss"),
        "lastCheckpointStep": checkpoint.get("step"),
        "preemptions": status.get("preemptions", 0),
        "failures": status.get("failures", 0),
        "goodput": (status.get("goodput") or {}).get("ratio"),
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


def status_table(runs: list[dict[str, Any]], now: datetime | None = None) -> str:
    rows = []
    for run in runs:
        row = run_summary(run)
        rows.append(
            (
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
    return render_table(COLUMNS, rows)


def goodput_line(goodput: dict[str, Any]) -> str:
    """status.goodput in words: the ratio, the surviving time, the lost time by cause (biggest first)."""
    redone = goodput.get("stepsRedone") or []
    return (
        f"{goodput.get('ratio', 0):.2f} ({goodput.get('survivingStepSeconds', 0)} s of "
        f"{goodput.get('wallSeconds', 0)} s in steps that survived; lost: "
        + lost_time_summary(goodput.get("lostSeconds") or {})
        + (f"; steps redone after each resume: {', '.join(map(str, redone))}" if redone else "")
        + ")"
    )


def cost_line(cost: dict[str, Any]) -> str:
    """status.cost in words: the run's cost so far beside an on-demand run of the same steps."""
    currency = f" {cost['currency']}" if cost.get("currency") else ""
    saved = cost.get("savedRatio")
    return (
        f"{cost.get('run', 0):.2f}{currency} so far; on demand, the same steps: "
        f"{cost.get('onDemandSameSteps', 0):.2f}{currency}"
        + (f" (spot saved {saved:.0%})" if saved is not None and saved >= 0 else "")
        + (f" (spot cost {-saved:.0%} more)" if saved is not None and saved < 0 else "")
    )


def interval_line(chosen: dict[str, Any]) -> str:
    """status.checkpointInterval in words: the interval and the numbers it came from."""
    if chosen.get("targetSeconds") is None:
        return f"every {chosen.get('steps')} steps (auto: the shortest allowed, until a checkpoint's cost is measured)"
    return (
        f"every {chosen.get('steps')} steps (auto: sqrt(2 x {chosen.get('checkpointSeconds')} s per checkpoint x "
        f"{chosen.get('meanSecondsBetweenInterruptions'):.0f} s between interruptions) = "
        f"{chosen['targetSeconds']:.0f} s at {chosen.get('stepSeconds')} s a step; "
        f"{chosen.get('interruptions')} interruption(s) in {chosen.get('observedSeconds', 0):.0f} s seen; "
        f"bounds {chosen.get('minSteps')}-{chosen.get('maxSteps')})"
    )


def _ago(time: str | None, now: datetime) -> str:
    return f"{age_since(time, now)} ago" if time else "-"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def describe_run(run: dict[str, Any], now: datetime | None = None) -> str:
    """A ``kubectl describe``-like view of one run."""
    now = now or datetime.now(UTC)
    metadata = run["metadata"]
    status = run.get("status") or {}
    progress = status.get("progress") or {}
    checkpoint = status.get("lastCheckpoint") or {}
    fields: list[tuple[str, object]] = [
        ("Name", metadata["name"]),
        ("Namespace", metadata.get("namespace")),
        ("Age", age_since(metadata.get("creationTimestamp"), now)),
        ("Phase", status.get("phase") or "- (the controller has not seen it yet)"),
        ("Message", status.get("message")),
        ("Attempt", f"{status['attempt']} (RayJob {status.get('rayJob', '-')})" if status.get("attempt") else None),
    ]
    if progress.get("step") is not None:
        rate = progress.get("stepsPerSecond")
        fields.append(
            (
                "Progress",
                f"step {_step(progress['step'], progress.get('totalSteps'))}, loss {_loss(progress.get('loss'))}"
                + (f", {rate:.2f} steps/s" if rate else "")
                + f" (updated {_ago(progress.get('updateTime'), now)})",
            )
        )
    if checkpoint.get("step") is not None:
        fields.append(
            (
                "Last checkpoint",
                f"step {checkpoint['step']} at {checkpoint.get('uri', '-')} ({_ago(checkpoint.get('time'), now)})",
            )
        )
    if status.get("checkpointInterval"):
        fields.append(("Checkpoints", interval_line(status["checkpointInterval"])))
    if status.get("goodput"):
        fields.append(("Goodput", goodput_line(status["goodput"])))
    if status.get("cost"):
        fields.append(("Cost", cost_line(status["cost"])))
    fields += [
        ("Preemptions", status.get("preemptions", 0)),
        ("Failures", status.get("failures", 0)),
        ("Next attempt", status.get("nextAttemptTime")),
    ]
    lines = [f"{key + ':':<17}{value}" for key, value in fields if value is not None]
    attempts = status.get("attempts") or []
    if attempts:
        rows = [
            (
                a.get("attempt"),
                a.get("rayJob", "-"),
                a.get("outcome", "-"),
                a.get("reason") or "-",
                _dash(a.get("resumedFrom")),
                _ago(a.get("startTime"), now),
                _ago(a.get("endTime"), now),
                a.get("message") or "",
            )
            for a in attempts
        ]
        headers = ("attempt", "rayjob", "outcome", "reason", "resumed from", "started", "ended", "message")
        lines += ["Attempts:", _indent(render_table(headers, rows))]
    conditions = status.get("conditions") or []
    if conditions:
        condition_rows = [
            (c.get("type"), c.get("status"), c.get("reason"), _ago(c.get("lastTransitionTime"), now), c.get("message"))
            for c in conditions
        ]
        condition_headers = ("type", "status", "reason", "changed", "message")
        lines += ["Conditions:", _indent(render_table(condition_headers, condition_rows))]
    return "\n".join(lines)


def status_command(cluster: ClusterConnection, name: str | None, fmt: str) -> int:
    if name is not None:
        run = cluster.get_run(name)
        emit(describe_run(run) if fmt == "table" else render_data(run, fmt))
        return 0
    runs = cluster.list_runs()
    if fmt != "table":
        emit(render_data([run_summary(run) for run in runs], fmt))
    elif runs:
        emit(status_table(runs))
    else:
        emit(f"no TrainingRuns in namespace {cluster.namespace} (context {cluster.context_name})")
    return 0
