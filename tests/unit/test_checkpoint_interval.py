"""everySteps: auto (train/hf/checkpoint_interval.py): Young/Daly from measured numbers, bounded, and a real
Trainer saving where the decision says (issue #16, item 3)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotray.contract.spec import CheckpointSpec
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.checkpoint_interval import (
    PRIOR_MTBI_S,
    AutoCheckpointInterval,
    RunHistory,
    choose_interval,
    mean_time_between_interruptions,
)
from spotray.train.records.event_log import EventLog
from spotray.train.records.goodput import Lifetime
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter, read_attempt_progress
from spotray.train.storage.store import open_store
from tests.conftest import saved_steps_and_uploads_checked

pytestmark = pytest.mark.unit


def test_young_daly_in_steps() -> None:
    # C = 2 s, M = 3600 s: sqrt(2 * 2 * 3600) = 120 s; at 0.5 s a step, 240 steps.
    decision = choose_interval(2.0, 0.5, observed_s=0.0, interruptions=0, min_steps=10, max_steps=1000)
    assert decision.target_s == pytest.approx(120.0)
    assert decision.steps == 240
    assert decision.to_status()["meanSecondsBetweenInterruptions"] == PRIOR_MTBI_S


def test_more_interruptions_mean_shorter_intervals_within_the_bounds() -> None:
    calm = choose_interval(2.0, 0.5, observed_s=7200.0, interruptions=0, min_steps=10, max_steps=10_000)
    stormy = choose_interval(2.0, 0.5, observed_s=7200.0, interruptions=9, min_steps=10, max_steps=10_000)
    assert stormy.mtbi_s == pytest.approx((7200.0 + PRIOR_MTBI_S) / 10)
    assert stormy.steps < calm.steps
    assert stormy.steps == round(math.sqrt(2 * 2.0 * stormy.mtbi_s) / 0.5)
    assert choose_interval(2.0, 0.5, 0.0, 0, min_steps=10, max_steps=50).steps == 50
    assert choose_interval(1e-6, 0.5, 0.0, 99, min_steps=10, max_steps=50).steps == 10


def test_no_measured_cost_yet_means_the_shortest_interval_which_measures_it() -> None:
    decision = choose_interval(None, None, 0.0, 0, min_steps=7, max_steps=50)
    assert (decision.steps, decision.target_s) == (7, None)
    assert "targetSeconds" not in decision.to_status()


def test_the_estimate_starts_from_the_prior_and_follows_what_was_observed() -> None:
    assert mean_time_between_interruptions(0.0, 0) == PRIOR_MTBI_S
    assert mean_time_between_interruptions(36_000.0, 39) == pytest.approx((36_000.0 + PRIOR_MTBI_S) / 40)


def test_history_of_earlier_worker_groups() -> None:
    lifetimes = [
        Lifetime(1, None, [(s, 1.0, 10.0 + 2 * s) for s in range(1, 11)], started_at=5.0, checkpoint_stalls=[(5, 0.5)]),
        Lifetime(2, 5, [(s, 1.0, 100.0 + 2 * s) for s in range(6, 11)], started_at=100.0),
    ]
    history = RunHistory.from_lifetimes(lifetimes)
    assert history.interruptions == 2
    assert history.observed_s == pytest.approx((30.0 - 5.0) + (120.0 - 100.0))
    assert history.stalls_s == (0.5,)
    assert history.step_s == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("interruptions", "expected_steps"),
    [
        (0, [4, 16, 28, 40]),  # none yet: a 1e9 s prior puts Young/Daly's interval far past maxEverySteps
        (10**12, list(range(4, 41, 4))),  # interruptions all the time: minEverySteps
    ],
)
def test_a_trainer_saves_where_the_decisions_say_and_records_them(
    tmp_path: Path, interruptions: int, expected_steps: list[int]
) -> None:
    """The real gpt2 Trainer, single process: the first save at minEverySteps (no cost measured yet), then
    the interval Young/Daly gives from the measured cost, within the bounds; the last step always saves."""
    from spotray.jobs.gpt2.config import Gpt2JobConfig  # noqa: PLC0415 - needs the job's packages
    from spotray.jobs.gpt2.train import build_trainer  # noqa: PLC0415 - needs the job's packages

    uri = f"file://{tmp_path / 'ckpt'}"
    store = open_store(uri)
    spec = CheckpointSpec(uri=uri, every_steps="auto", min_every_steps=4, max_every_steps=12)
    progress = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1"), interval_s=0)
    events = EventLog(tmp_path / "events.jsonl")
    sync = S3CheckpointCallback(uri, store=store, keep=50, staging_dir=tmp_path / "staging", events=events)
    history = RunHistory(interruptions=interruptions)
    auto = AutoCheckpointInterval(spec, sync, history, progress=progress, prior_s=1e9)
    job = Gpt2JobConfig(workdir=tmp_path / "job", max_steps=40, batch_size=2)
    trainer = build_trainer(job, [sync, auto], save_steps=0)
    trainer.train()
    sync.flush()
    assert progress.close(timeout_s=10)

    assert saved_steps_and_uploads_checked(tmp_path / "events.jsonl", store) == expected_steps
    recorded = read_attempt_progress(store, progress.progress.attempt_id)
    assert recorded is not None
    decision = recorded.checkpoint_interval
    assert decision is not None
    assert decision["checkpointSeconds"] > 0  # measured from the saves
    assert decision["stepSeconds"] > 0
    assert (decision["minSteps"], decision["maxSteps"]) == (4, 12)
    assert decision["steps"] == (12 if interruptions == 0 else 4)
    assert decision["interruptions"] == interruptions
