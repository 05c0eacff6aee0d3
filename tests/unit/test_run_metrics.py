"""Per-run metrics (controller/metrics.py): what a run's status says, as Prometheus gauges labelled by
namespace and run, dropped when the run is forgotten (issue 72)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from spotray.contract.status import RunStatus
from spotray.controller import metrics

pytestmark = pytest.mark.unit

STATUS = {
    "phase": "Running",
    "attempt": 3,
    "preemptions": 2,
    "failures": 1,
    "progress": {"step": 120, "totalSteps": 200, "loss": 2.5},
    "lastCheckpoint": {"step": 100, "uri": "s3://b/r/checkpoint-100", "time": "2026-12-02T10:00:00Z"},
    "goodput": {"ratio": 0.875},
}


def scrape() -> str:
    return generate_latest(metrics.REGISTRY).decode()


def test_a_runs_status_becomes_its_gauges_and_leaves_with_it() -> None:
    metrics.observe_run("team", "gpt2", metrics.RunFigures.of(RunStatus.from_status(STATUS)))
    text = scrape()
    labels = 'namespace="team",run="gpt2"'
    for line in (
        f"spotray_run_step{{{labels}}} 120.0",
        f"spotray_run_total_steps{{{labels}}} 200.0",
        f"spotray_run_loss{{{labels}}} 2.5",
        f"spotray_run_attempt{{{labels}}} 3.0",
        f"spotray_run_preemptions{{{labels}}} 2.0",
        f"spotray_run_failures{{{labels}}} 1.0",
        f"spotray_run_goodput_ratio{{{labels}}} 0.875",
        f"spotray_run_last_checkpoint_step{{{labels}}} 100.0",
        f"spotray_run_last_checkpoint_timestamp_seconds{{{labels}}} 1.7962056e+09",
        'spotray_run_phase{namespace="team",phase="Running",run="gpt2"} 1.0',
    ):
        assert line in text, line
    assert 'spotray_trainingruns{phase="Running"}' in text

    metrics.forget_run("team", "gpt2")
    assert 'run="gpt2"' not in scrape()


def test_a_run_with_no_figures_yet_shows_its_phase_only() -> None:
    metrics.set_phase("team", "refused", "Failed")
    text = scrape()
    assert 'spotray_run_phase{namespace="team",phase="Failed",run="refused"} 1.0' in text
    assert 'spotray_run_step{namespace="team",run="refused"}' not in text
    metrics.forget_run("team", "refused")


def test_an_unreadable_checkpoint_time_gives_no_timestamp() -> None:
    status = {**STATUS, "lastCheckpoint": {"step": 100, "time": "yesterday"}}
    figures = metrics.RunFigures.of(RunStatus.from_status(status))
    assert figures.last_checkpoint_step == 100
    assert figures.last_checkpoint_timestamp_seconds is None
