"""The TrainingRun status model (spotray/contract/status.py): its JSON form both ways, what a reader
makes of an older or partial status, the controller's merge patch, and the job's writers in step."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from spotray.contract.spec import camel
from spotray.contract.status import (
    AttemptStatus,
    CheckpointInterval,
    Condition,
    Goodput,
    LostSeconds,
    Progress,
    RunStatus,
)
from spotray.decisions.run_state import RunState
from spotray.train.hf.checkpoint_interval import IntervalDecision
from spotray.train.records.goodput import CAUSES, Ledger

pytestmark = [pytest.mark.unit]

# A status as the controller writes it: every object and list it holds, with every key each can have.
STATUS: dict[str, Any] = {
    "phase": "Resuming",
    "attempt": 2,
    "preemptions": 1,
    "failures": 0,
    "rayJob": "gpt2-a2",
    "message": "attempt 1 preempted (NodeLost): node n1 gone; attempt 2 starts in 10 s",
    "nextAttemptTime": "2026-01-01T11:31:10Z",
    "storageUnreachableSince": "2026-01-01T11:30:30Z",
    "observedGeneration": 3,
    "progress": {
        "step": 130,
        "totalSteps": 200,
        "loss": 3.2144,
        "stepsPerSecond": 8.4,
        "updateTime": "2026-01-01T11:29:55Z",
    },
    "lastCheckpoint": {"step": 120, "uri": "s3://b/runs/gpt2/checkpoint-120", "time": "2026-01-01T11:28:00Z"},
    "goodput": {
        "ratio": 0.812,
        "wallSeconds": 3500,
        "survivingStepSeconds": 2842,
        "lostSeconds": {
            "waitingForCapacity": 400,
            "startUp": 0,
            "restarts": 58,
            "redoneSteps": 180,
            "checkpointBlocking": 20,
            "other": 0,
        },
        "stepsRedone": [60],
        "workerRestarts": 1,
    },
    "cost": {"currency": "USD", "run": 2.5, "onDemandSameSteps": 4.55, "savedRatio": 0.451},
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
        {
            "attempt": 1,
            "rayJob": "gpt2-a1",
            "outcome": "Preempted",
            "reason": "NodeLost",
            "message": "node n1 gone",
            "startTime": "2026-01-01T11:00:00Z",
            "endTime": "2026-01-01T11:30:00Z",
        },
        {
            "attempt": 2,
            "rayJob": "gpt2-a2",
            "outcome": "Running",
            "reason": "",
            "message": "",
            "startTime": "2026-01-01T11:31:00Z",
            "resumedFrom": 120,
        },
    ],
    "conditions": [
        {
            "type": "Progressing",
            "status": "True",
            "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T11:00:00Z",
            "reason": "Resuming",
            "message": "attempt 2 starts in 10 s",
        }
    ],
}


def test_a_status_round_trips_through_the_model() -> None:
    status = RunStatus.from_status(STATUS)
    assert status.to_status() == STATUS
    assert RunStatus.from_status(status.to_status()) == status
    assert status.progress == Progress(
        step=130, total_steps=200, loss=3.2144, steps_per_second=8.4, update_time="2026-01-01T11:29:55Z"
    )
    assert status.attempts is not None
    assert status.attempts[1].resumed_from == 120
    assert status.goodput is not None
    assert status.goodput.lost_seconds is not None
    assert status.goodput.lost_seconds.waiting_for_capacity == 400
    assert status.goodput.steps_redone == (60,)


def test_every_key_is_the_camel_case_of_its_field() -> None:
    assert set(RunStatus.from_status(STATUS).to_status()) == {
        "phase",
        "attempt",
        "preemptions",
        "failures",
        "rayJob",
        "message",
        "nextAttemptTime",
        "storageUnreachableSince",
        "observedGeneration",
        "progress",
        "lastCheckpoint",
        "goodput",
        "cost",
        "checkpointInterval",
        "attempts",
        "conditions",
    }


def test_a_run_the_controller_has_not_seen_reads_as_all_unset() -> None:
    assert RunStatus.of({"metadata": {"name": "new"}, "spec": {}}) == RunStatus()
    assert RunStatus.from_status({}).to_status() == {}


def test_an_older_or_partial_status_reads_with_defaults_and_unknown_keys_are_ignored() -> None:
    older = {
        "phase": "Running",
        "attempt": 1,
        "progress": {"step": 5},  # no loss, no speed yet
        "lastCheckpoint": None,  # a null reads as missing
        "attempts": [{"attempt": 1, "outcome": "Running"}],  # no rayJob, reason, times
        "conditions": [{"type": "Running", "status": "True"}],
        "someFutureField": {"x": 1},
    }
    status = RunStatus.from_status(older)
    assert (status.phase, status.attempt, status.preemptions, status.failures) == ("Running", 1, None, None)
    assert status.progress == Progress(step=5)
    assert status.last_checkpoint is None
    assert status.attempts == (AttemptStatus(attempt=1, outcome="Running"),)
    assert status.attempts[0].ray_job == ""
    assert status.attempts[0].start_time is None
    assert status.conditions == (Condition(type="Running", status="True"),)
    assert "someFutureField" not in status.to_status()


def test_the_lifecycle_counts_the_budgets_of_a_status_that_has_no_counters() -> None:
    older = {
        "phase": "Resuming",
        "attempts": [
            {"attempt": 1, "rayJob": "r-a1", "outcome": "Preempted", "startTime": "2026-01-01T11:00:00Z"},
            {"attempt": 2, "rayJob": "r-a2", "outcome": "Failed", "startTime": "2026-01-01T11:10:00Z"},
        ],
    }
    state = RunState.from_status(older)
    assert (state.preemptions, state.failures) == (1, 1)
    assert state.current is not None
    assert state.current.ray_job == "r-a2"


def test_the_merge_patch_removes_what_the_lifecycle_unset_and_keeps_what_was_not_read() -> None:
    patch = RunStatus(phase="Pending", attempt=2, message="attempt 2 starting").to_patch()
    # Written as null, which removes the stored value: the backoff is over, the store is back.
    assert patch["nextAttemptTime"] is None
    assert patch["storageUnreachableSince"] is None
    assert patch["rayJob"] is None
    # Left out, so the stored value stays: the store was not read this time.
    assert "progress" not in patch
    assert "goodput" not in patch
    assert "conditions" not in patch
    assert "nextAttemptTime" not in RunStatus(phase="Failed").to_status()


def test_the_lifecycle_writes_its_fields_and_reads_them_back() -> None:
    state = RunState(
        phase="Resuming",
        attempts=(AttemptStatus(attempt=1, ray_job="r-a1", outcome="Failed", start_time="2026-01-01T11:00:00Z"),),
        message="attempt 1 failed",
        next_attempt_time="2026-01-01T11:00:10Z",
        failures=1,
    )
    status = state.to_status()
    assert status == {
        "phase": "Resuming",
        "attempt": 1,
        "preemptions": 0,
        "failures": 1,
        "rayJob": "r-a1",
        "message": "attempt 1 failed",
        "nextAttemptTime": "2026-01-01T11:00:10Z",
        "storageUnreachableSince": None,
        "attempts": [
            {
                "attempt": 1,
                "rayJob": "r-a1",
                "outcome": "Failed",
                "reason": "",
                "message": "",
                "startTime": "2026-01-01T11:00:00Z",
            }
        ],
    }
    assert RunState.from_status(status) == state


def test_the_jobs_writers_use_the_models_keys() -> None:
    """train/ writes status.goodput and status.checkpointInterval itself: nothing it writes may be lost."""
    ledger = Ledger(
        wall_s=100.0,
        surviving_step_s=80.0,
        lost_s=dict.fromkeys(CAUSES, 3.0),
        redone_per_resume=(4, 2),
        attempts=2,
        worker_restarts=1,
        spot_notices=0,
    )
    assert Goodput.from_status(ledger.to_status()).to_status() == ledger.to_status()
    assert set(CAUSES) == {camel(field.name) for field in dataclasses.fields(LostSeconds)}
    decision = IntervalDecision(
        steps=50,
        target_s=12.5,
        checkpoint_s=0.4,
        step_s=0.25,
        mtbi_s=600.0,
        interruptions=2,
        observed_s=1200.0,
        min_steps=10,
        max_steps=500,
    )
    assert CheckpointInterval.from_status(decision.to_status()).to_status() == decision.to_status()
    assert set(decision.to_status()) == {camel(field.name) for field in dataclasses.fields(CheckpointInterval)}
