"""The watch check behind /healthz: a stalled TrainingRun watch is found, a busy or slow one is not."""

import logging

import pytest

from spotray.controller.watch_health import WatchChecker, WatchHealth

pytestmark = [pytest.mark.unit]

RUN = ("team-a", "bert")
OTHER = ("team-a", "gpt")


def test_a_watch_that_delivered_what_the_list_shows_is_healthy() -> None:
    health = WatchHealth(grace_s=60)
    health.saw(RUN, "10", now=0)
    assert health.compare({RUN: "10"}, now=1) is None
    assert health.compare({RUN: "10"}, now=1000) is None


def test_a_new_run_never_delivered_fails_the_check_after_the_grace() -> None:
    health = WatchHealth(grace_s=60)
    assert health.compare({RUN: "10"}, now=0) is None  # just created: the event may be on its way
    assert health.compare({RUN: "10"}, now=59) is None
    problem = health.compare({RUN: "10"}, now=60)
    assert problem is not None
    assert "stalled" in problem
    assert "team-a/bert" in problem
    assert health.problem == problem


def test_a_busy_run_whose_events_keep_coming_is_never_late() -> None:
    """Each LIST sees a version the watch has not delivered yet, but events do keep coming."""
    health = WatchHealth(grace_s=60)
    for minute in range(10):
        now = minute * 60.0
        health.saw(RUN, str(minute), now=now)
        assert health.compare({RUN: str(minute + 1)}, now=now + 1) is None  # patched again just before the LIST


def test_the_watch_catching_up_clears_the_problem() -> None:
    health = WatchHealth(grace_s=60)
    health.compare({RUN: "10", OTHER: "3"}, now=0)
    assert health.compare({RUN: "10", OTHER: "3"}, now=61) is not None
    health.saw(RUN, "10", now=62)
    health.saw(OTHER, "3", now=62)
    assert health.compare({RUN: "10", OTHER: "3"}, now=63) is None
    assert health.problem is None


def test_a_run_deleted_meanwhile_is_not_waited_for() -> None:
    health = WatchHealth(grace_s=60)
    health.compare({RUN: "10"}, now=0)
    assert health.compare({}, now=100) is None
    health.forget(RUN)
    assert health.compare({RUN: "11"}, now=101) is None  # created again: a new wait starts


def test_an_unreadable_list_is_no_verdict(caplog: pytest.LogCaptureFixture) -> None:
    health = WatchHealth(grace_s=60)
    health.compare({RUN: "10"}, now=0)
    health.compare({RUN: "10"}, now=100)
    assert health.problem is not None

    def unreachable() -> dict[tuple[str, str], str]:
        raise OSError("connection refused")

    with caplog.at_level(logging.WARNING):
        WatchChecker(health, unreachable, interval_s=1).check_once()
    assert health.problem is not None  # unchanged: neither cleared nor made up
    assert "could not list TrainingRuns" in caplog.text


def test_the_checker_reports_a_stall_and_the_recovery(caplog: pytest.LogCaptureFixture) -> None:
    health = WatchHealth(grace_s=0.0)
    listed = {RUN: "10"}
    checker = WatchChecker(health, lambda: listed, interval_s=1)
    with caplog.at_level(logging.INFO):
        checker.check_once()  # starts the wait
        checker.check_once()  # grace 0: late now
        assert health.problem is not None
        health.saw(RUN, "10", now=1e12)
        checker.check_once()
    assert health.problem is None
    assert "/healthz now fails" in caplog.text
    assert "caught up" in caplog.text
