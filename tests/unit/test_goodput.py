"""train/records/goodput.py and the loss plot: attempts, worker restarts and spot notices told apart, and where
a run's wall time went (issue #16, item 4 and the local part of item 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotray.train.records.goodput import Lifetime, attempts_from_progress, ledger, split_lifetimes
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit


def steps(first: int, last: int, start_time: float, seconds_per_step: float = 1.0) -> list[dict[str, Any]]:
    return [
        {"event": "step", "step": step, "loss": 1.0 / step, "time": start_time + (step - first) * seconds_per_step}
        for step in range(first, last + 1)
    ]


def demo_events() -> list[dict[str, Any]]:
    """What `make demo` logs: attempt 1 loses a worker at step 45 (restart inside attempt 1, resumed
    from 40), then loses its head at 110 (attempt 2, from 100), a spot notice at 156 (attempt 3)."""
    return [
        {"event": "worker_start", "time": 0.0},
        {"event": "start", "attempt": 1, "resumed_from": None, "time": 1.0},
        *steps(1, 45, 10.0),  # steps 1-45 at t = 10..54
        {"event": "start", "attempt": 1, "resumed_from": 40, "time": 70.0},
        *steps(41, 110, 80.0),  # 41-110 at t = 80..149
        {"event": "start", "attempt": 2, "resumed_from": 100, "time": 170.0},
        *steps(101, 156, 180.0),  # 101-156 at t = 180..235
        {"event": "preemption_notice", "step": 156, "time": 236.0},
        {"event": "checkpoint_complete", "step": 156, "time": 237.0},
        {"event": "start", "attempt": 3, "resumed_from": 156, "time": 260.0},
        *steps(157, 200, 270.0),  # 157-200 at t = 270..313
        {"event": "end", "step": 200, "time": 320.0},
    ]


def test_a_worker_restart_inside_an_attempt_is_not_counted_as_an_attempt() -> None:
    lifetimes, first, last = split_lifetimes(demo_events())
    assert [(life.attempt, life.restart, life.resumed_from) for life in lifetimes] == [
        (1, False, None),
        (1, True, 40),
        (2, False, 100),
        (3, False, 156),
    ]
    assert lifetimes[2].notice_step == 156
    assert lifetimes[-1].finished
    assert (first, last) == (0.0, 320.0)


def test_the_ledger_counts_surviving_step_time_and_redone_steps() -> None:
    spent = ledger(*split_lifetimes(demo_events()))
    # Surviving: steps 2-40 (39 s; step 1 has no step before it in its lifetime), 42-100 (59 s),
    # 102-156 (55 s), 158-200 (43 s): 196 s of a 320 s wall. Redone: 41-45 and 101-110.
    assert spent.surviving_step_s == pytest.approx(196.0)
    assert spent.wall_s == pytest.approx(320.0)
    assert spent.goodput == pytest.approx(196.0 / 320.0)
    assert spent.steps_redone == 15
    assert (spent.attempts, spent.worker_restarts, spent.spot_notices) == (3, 1, 1)
    assert spent.summary().startswith("3 attempt(s), 1 worker restart(s), 1 spot notice(s); goodput 0.61")


def test_a_resume_from_an_older_checkpoint_makes_the_earlier_steps_redone_too() -> None:
    """The newest checkpoint was unusable: attempt 3 resumed from 20, below where attempt 2 began."""
    lifetimes = [
        Lifetime(1, None, [(s, 1.0, float(s)) for s in range(1, 31)]),
        Lifetime(2, 30, [(s, 1.0, float(s)) for s in range(31, 41)]),
        Lifetime(3, 20, [(s, 1.0, float(s)) for s in range(21, 51)], finished=True),
    ]
    spent = ledger(lifetimes, 0.0, 100.0)
    assert spent.steps_redone == 10 + 10  # 21-30 of attempt 1 and all of attempt 2
    assert spent.surviving_step_s == pytest.approx(19.0 + 29.0)  # steps 2-20 and 22-50


def test_logs_without_attempt_numbers_count_every_start_as_an_attempt() -> None:
    events = [{"event": "start", "resumed_from": None}, {"event": "start", "resumed_from": 5}]
    assert [(life.attempt, life.restart) for life in split_lifetimes(events)[0]] == [(1, False), (2, False)]


def test_the_plot_names_what_happened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from spotray.train.records import plot  # noqa: PLC0415 - needs the plot extra

    texts: list[str] = []
    labels: list[str] = []
    original_text, original_plot = plot.plt.Axes.text, plot.plt.Axes.plot

    def record_text(self: Any, x: float, y: float, words: str, **kwargs: Any) -> Any:
        texts.append(words.strip())
        return original_text(self, x, y, words, **kwargs)

    def record_plot(self: Any, *args: Any, **kwargs: Any) -> Any:
        labels.append(str(kwargs.get("label", "")))
        return original_plot(self, *args, **kwargs)

    monkeypatch.setattr(plot.plt.Axes, "text", record_text)
    monkeypatch.setattr(plot.plt.Axes, "plot", record_plot)
    lifetimes, _, _ = split_lifetimes(demo_events())
    png = plot.plot_loss_across_attempts(lifetimes, tmp_path / "loss.png", "demo")
    assert png.stat().st_size > 0
    assert [label for label in labels if label.startswith("attempt")] == [
        "attempt 1 (fresh start)",
        "attempt 2 (resumed from step 100)",
        "attempt 3 (resumed from step 156)",
    ]  # three attempts in the legend, as the CLI counts them
    assert texts == [
        "a worker lost at step 45",
        "workers restarted from step 40",
        "attempt 1 lost at step 110",
        "attempt 2 resumed from step 100",
        "spot notice at step 156: checkpoint",
        "attempt 3 resumed from step 156",
    ]


def test_lost_time_by_cause_adds_up_to_the_wall_time() -> None:
    spent = ledger(*split_lifetimes(demo_events()))
    lost = spent.lost_s
    assert lost["startUp"] == pytest.approx(10.0)  # first event at 0, first step at 10
    # 45 at t=54 -> 41 at t=80; 110 at t=149 -> 101 at t=180; 156 at t=235 -> 157 at t=270.
    assert lost["restarts"] == pytest.approx(26.0 + 31.0 + 35.0)
    assert lost["redoneSteps"] == pytest.approx(5.0 + 10.0)  # steps 41-45 and 101-110
    assert lost["waitingForCapacity"] == 0.0  # a local run asks for no nodes
    assert lost["other"] == pytest.approx(7.0)  # after the last step (t=313) to the end event (t=320)
    assert spent.surviving_step_s + sum(lost.values()) == pytest.approx(spent.wall_s)
    assert spent.redone_per_resume == (5, 10, 0)


def test_checkpoint_stalls_of_surviving_steps_are_lost_time_and_the_others_are_redone() -> None:
    lifetimes = [
        Lifetime(
            1, None, [(s, 1.0, float(s)) for s in range(1, 31)], checkpoint_stalls=[(10, 0.5), (20, 0.5), (25, 0.5)]
        ),
        Lifetime(2, 20, [(s, 1.0, float(s + 10)) for s in range(21, 41)], checkpoint_stalls=[(30, 0.5)], finished=True),
    ]
    spent = ledger(lifetimes, 0.0, 50.0)
    assert spent.lost_s["checkpointBlocking"] == pytest.approx(1.5)  # steps 10, 20 and 30; 25 was redone
    assert spent.surviving_step_s == pytest.approx(19.0 + 19.0 - 1.5)
    assert spent.surviving_step_s + sum(spent.lost_s.values()) == pytest.approx(spent.wall_s)


def test_waiting_for_capacity_is_the_time_from_asking_for_an_attempt_to_its_workers_starting() -> None:
    """Attempt 2 was asked for at t=100 and its workers started at t=400: 300 s waiting for nodes."""
    progress = [
        AttemptProgress(1, "r", None, 60, 2, 0.0, [(s, 1.0, 10.0 + s) for s in range(1, 31)], started=5.0),
        AttemptProgress(2, "r", 30, 60, 2, 0.0, [(s, 1.0, 400.0 + s) for s in range(31, 61)], started=400.0),
    ]
    lifetimes = attempts_from_progress(progress, {1: 0.0, 2: 100.0})
    spent = ledger(lifetimes, 0.0, 460.0)
    assert spent.lost_s["waitingForCapacity"] == pytest.approx(5.0 + 300.0)
    assert spent.lost_s["startUp"] == pytest.approx(11.0 - 5.0)  # workers up at 5, first step at 11
    assert spent.lost_s["restarts"] == pytest.approx((431.0 - 40.0) - 300.0)
    assert spent.to_status()["lostSeconds"]["waitingForCapacity"] == 305
    assert spent.to_status()["ratio"] == pytest.approx(spent.goodput, abs=1e-3)


def test_a_worker_restart_recorded_in_the_progress_object_is_its_own_lifetime() -> None:
    """A worker group restarted inside attempt 1 at t=50 from step 20: the points and stalls after it are its own."""
    progress = AttemptProgress(
        1,
        "r",
        None,
        60,
        2,
        0.0,
        [(s, 1.0, float(s)) for s in range(1, 26)] + [(s, 1.0, 40.0 + s) for s in range(21, 61)],
        started=0.0,
        restarts=[(20, 50.0)],
        checkpoint_stalls=[(20, 0.4, 20.5), (40, 0.6, 80.5)],
    )
    first, second = attempts_from_progress([progress])
    assert (first.resumed_from, first.last_step, first.checkpoint_stalls) == (None, 25, [(20, 0.4)])
    assert (second.resumed_from, second.last_step, second.restart, second.started_at) == (20, 60, True, 50.0)
    assert second.checkpoint_stalls == [(40, 0.6)]
    spent = ledger([first, second], 0.0, 100.0)
    assert (spent.attempts, spent.worker_restarts, spent.redone_per_resume) == (1, 1, (5,))
