"""The CLI's pure parts: tables, ages, exit codes, status views, the watch's notes, RUN resolution."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotray.cli.cluster_options import KubeOptions
from spotray.cli.exit_codes import NotFoundError, exit_code_for
from spotray.cli.logs import dashboard_base, head_service
from spotray.cli.output import human_age, human_bytes, render_table
from spotray.cli.run_status import describe_run, run_summary, status_table
from spotray.cli.target import locate_run
from spotray.cli.watch import StatusFollower
from spotray.contract.errors import CorruptCheckpointError, InvalidUriError, SpotrayError, StoreUnreachableError
from spotray.contract.spec import InvalidSpecError
from spotray.local.progress import ProgressView
from spotray.train.records.goodput import attempts_from_progress
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_table_aligns_columns_like_kubectl() -> None:
    assert render_table(("name", "phase"), [("a", "Running"), ("longer-name", None)]) == (
        "NAME          PHASE\na             Running\nlonger-name"
    )


@pytest.mark.parametrize(
    ("seconds", "shown"), [(5, "5s"), (119, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"), (3 * 86400, "3d")]
)
def test_age_uses_the_largest_unit_that_gives_at_least_two(seconds: int, shown: str) -> None:
    assert human_age(seconds) == shown


def test_sizes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(5 * 1024 * 1024) == "5.0 MiB"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotFoundError("p", "f"), 3),
        (CorruptCheckpointError("p", "f"), 1),
        (StoreUnreachableError("p", "f"), 1),
        (InvalidUriError("p", "f"), 2),
        (InvalidSpecError(["spec.x: bad"]), 2),
        (SpotrayError("p", "f"), 2),
    ],
)
def test_exit_codes(error: SpotrayError, code: int) -> None:
    assert exit_code_for(error) == code


def training_run(status: dict[str, Any] | None) -> dict[str, Any]:
    run: dict[str, Any] = {
        "metadata": {"name": "gpt2", "namespace": "team-a", "creationTimestamp": "2026-01-01T11:00:00Z"},
        "spec": {},
    }
    if status is not None:
        run["status"] = status
    return run


PREEMPTED_ATTEMPT = {
    "attempt": 1,
    "rayJob": "gpt2-a1",
    "outcome": "Preempted",
    "reason": "NodeLost",
    "startTime": "2026-01-01T11:00:00Z",
    "endTime": "2026-01-01T11:30:00Z",
}
RUNNING = {
    "phase": "Running",
    "attempt": 2,
    "preemptions": 1,
    "failures": 0,
    "rayJob": "gpt2-a2",
    "message": "attempt 2 running",
    "progress": {
        "step": 130,
        "totalSteps": 200,
        "loss": 3.2144,
        "stepsPerSecond": 8.4,
        "updateTime": "2026-01-01T11:59:55Z",
    },
    "lastCheckpoint": {"step": 120, "uri": "s3://b/runs/gpt2/checkpoint-120", "time": "2026-01-01T11:58:00Z"},
    "goodput": {
        "ratio": 0.812,
        "wallSeconds": 3500,
        "survivingStepSeconds": 2842,
        "lostSeconds": {"waitingForCapacity": 400, "restarts": 58, "redoneSteps": 180, "checkpointBlocking": 20},
        "stepsRedone": [60],
    },
    "checkpointInterval": {
        "steps": 120,
        "targetSeconds": 14.6,
        "checkpointSeconds": 0.05,
        "stepSeconds": 0.119,
        "meanSecondsBetweenInterruptions": 2121.0,
        "interruptions": 1,
        "observedSeconds": 642.0,
        "minSteps": 10,
        "maxSteps": 5000,
    },
    "attempts": [
        PREEMPTED_ATTEMPT,
        {
            "attempt": 2,
            "rayJob": "gpt2-a2",
            "outcome": "Running",
            "resumedFrom": 60,
            "startTime": "2026-01-01T11:31:00Z",
        },
    ],
    "conditions": [
        {"type": "Running", "status": "True", "reason": "AttemptRunning", "lastTransitionTime": "2026-01-01T11:31:00Z"}
    ],
}


def test_status_table_and_summary() -> None:
    table = status_table([training_run(RUNNING), training_run(None)], NOW)
    header, running, fresh = table.splitlines()
    assert header.split() == [
        "NAME",
        "PHASE",
        "ATTEMPT",
        "STEP",
        "LOSS",
        "CHECKPOINT",
        "PREEMPTIONS",
        "FAILURES",
        "GOODPUT",
        "AGE",
    ]
    assert running.split() == ["gpt2", "Running", "2", "130/200", "3.214", "120", "1", "0", "0.81", "60m"]
    assert fresh.split() == ["gpt2", "-", "-", "-", "-", "-", "0", "0", "-", "60m"]
    assert run_summary(training_run(RUNNING))["lastCheckpointStep"] == 120


def test_detail_view_shows_attempts_checkpoint_and_conditions() -> None:
    text = describe_run(training_run(RUNNING), NOW)
    assert "Phase:           Running" in text
    assert "Progress:        step 130/200, loss 3.214, 8.40 steps/s (updated 5s ago)" in text
    assert "Last checkpoint: step 120 at s3://b/runs/gpt2/checkpoint-120 (2m ago)" in text
    assert (
        "Goodput:         0.81 (2842 s of 3500 s in steps that survived; lost: waitingForCapacity 400 s, "
        "redoneSteps 180 s, restarts 58 s, checkpointBlocking 20 s; steps redone after each resume: 60)"
    ) in text
    assert "Checkpoints:     every 120 steps (auto: sqrt(2 x 0.05 s per checkpoint x 2121 s between" in text
    attempts = text.split("Attempts:")[1].split("Conditions:")[0].splitlines()
    assert attempts[2].split()[:6] == ["1", "gpt2-a1", "Preempted", "NodeLost", "-", "-"]
    assert attempts[3].split()[:6] == ["2", "gpt2-a2", "Running", "-", "-", "60"]  # no capacity recorded
    assert "AttemptRunning" in text


def test_watch_says_when_an_attempt_is_preempted_and_the_next_resumes() -> None:
    out = io.StringIO()
    follower = StatusFollower(ProgressView(stream=out), "gpt2", "team-a")
    first = {
        **RUNNING,
        "attempt": 1,
        "preemptions": 0,
        "rayJob": "gpt2-a1",
        "attempts": [{"attempt": 1, "outcome": "Running"}],
    }
    assert follower.update(training_run(first)) is None
    # The new attempt is counted before its history entry is written: it resumes from the last checkpoint.
    checkpoint_60 = {"step": 60, "uri": "s3://b/runs/gpt2/checkpoint-60", "time": "2026-01-01T11:29:00Z"}
    resuming = {**RUNNING, "phase": "Resuming", "attempts": [PREEMPTED_ATTEMPT], "lastCheckpoint": checkpoint_60}
    assert follower.update(training_run(resuming)) is None
    assert follower.update(training_run(RUNNING)) is None
    done = {**RUNNING, "phase": "Succeeded", "progress": {**RUNNING["progress"], "step": 200}}
    assert follower.update(training_run(done)) == 0
    text = out.getvalue()
    assert "attempt 1: RayJob gpt2-a1, starting fresh" in text
    assert "attempt 1 preempted (NodeLost)" in text
    assert "attempt 2: RayJob gpt2-a2, resuming from checkpoint-60" in text
    assert "phase Resuming" in text
    assert "spotray pull gpt2 -n team-a" in text
    failed = {**RUNNING, "phase": "Failed", "message": "attempt 2 failed: exit code 1\nTraceback (most recent..."}
    assert follower.update(training_run(failed)) == 1
    assert "phase Failed: attempt 2 failed: exit code 1\n" in out.getvalue()  # the log tail stays in `status`
    assert text.index("preempted") < text.index("attempt 2: RayJob")


def test_attempts_from_progress_keep_the_resume_points() -> None:
    progress = [
        AttemptProgress(1, "r", None, 100, 2, 0.0, [(1, 5.0, 0.0), (45, 4.0, 1.0)]),
        AttemptProgress(2, "r", 40, 100, 2, 0.0, []),  # started, never logged a step: kept (it waited)
        AttemptProgress(3, "r", 40, 100, 2, 0.0, [(41, 4.1, 2.0), (100, 3.0, 3.0)]),
    ]
    attempts = attempts_from_progress(progress)
    assert [(a.attempt, a.resumed_from, a.last_step, a.finished) for a in attempts] == [
        (1, None, 45, False),
        (2, 40, 40, False),
        (3, 40, 100, True),
    ]


def test_dashboard_and_head_service_from_the_rayjob() -> None:
    job = {"status": {"dashboardURL": "gpt2-a1-raycluster-x7k2p-head-svc.team-a.svc.cluster.local:8265"}}
    assert head_service(job) == "gpt2-a1-raycluster-x7k2p-head-svc"
    assert dashboard_base("host:8265/") == "http://host:8265"
    assert dashboard_base("https://host") == "https://host"


def test_run_resolution_without_a_cluster(tmp_path: Path) -> None:
    no_cluster = KubeOptions(kubeconfig=str(tmp_path / "none"))
    assert locate_run("s3://bucket/runs/gpt2", no_cluster).uri == "s3://bucket/runs/gpt2"
    assert locate_run("s3://bucket/runs/gpt2", no_cluster).name == "gpt2"
    assert locate_run(str(tmp_path), no_cluster).uri == f"file://{tmp_path}"  # a directory as a store
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: spotray.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: r1}\n"
        "spec: {entrypoint: echo, checkpoint: {uri: s3://bucket/r1}}\n"
    )
    assert (locate_run(str(manifest), no_cluster).name, locate_run(str(manifest), no_cluster).uri) == (
        "r1",
        "s3://bucket/r1",
    )
    with pytest.raises(NotFoundError):
        locate_run(str(tmp_path / "missing.yaml"), no_cluster)
    with pytest.raises(SpotrayError, match="no usable kube config"):
        locate_run("gpt2", no_cluster)


def test_sigterm_and_sighup_stop_a_local_run_as_ctrl_c_does() -> None:
    import signal  # noqa: PLC0415

    from spotray.cli.main import STOP_SIGNALS, stop_like_ctrl_c  # noqa: PLC0415

    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        stop_like_ctrl_c()
        handlers = {signal.getsignal(signum) for signum in STOP_SIGNALS}
        assert len(handlers) == 1
        (handler,) = handlers
        assert callable(handler)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGHUP, None)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
