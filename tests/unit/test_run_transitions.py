"""The run's state machine (spotray/decisions/run_plan.py ``RUN_TRANSITIONS``) is the one the plan makes.

tests/lifecycle_runs.py checks every decision of the unit tests against it; here each declared
transition is made by a short story, so the table holds nothing the plan never does, and the
terminal phases are never left.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from spotray.contract.attempts import AttemptRecords
from spotray.contract.names import FAILED, PENDING, RESUMING, RUNNING, SUCCEEDED, SUSPENDED
from spotray.decisions.observation import RayJobView
from spotray.decisions.run_plan import RUN_TRANSITIONS, transition
from spotray.decisions.run_state import RunState
from tests.lifecycle_runs import NOW, step

pytestmark = pytest.mark.unit

RUNNING_JOB = RayJobView("RUNNING", "Running")
SUCCEEDED_JOB = RayJobView("SUCCEEDED", "Complete", end_time=NOW)
PREEMPTED = AttemptRecords(preempted={"step": 10}, outcome={"exit_code": 143})
BAD_INPUT = AttemptRecords(outcome={"exit_code": 2, "detail": "no bucket"})
FAILED_JOB = RayJobView("FAILED", "Failed", "exit 2", end_time=NOW - timedelta(seconds=30))


def _stories() -> list[tuple[str, str]]:
    """(before, after) of each phase change in a few short runs."""
    seen: list[tuple[str, str]] = []

    def after(state: RunState, job: RayJobView | None, records: AttemptRecords | None = None, **kw: object) -> RunState:
        new = step(state, job, records, **kw).state
        if new.phase != state.phase:
            seen.append((state.phase, new.phase))
        return new

    pending = after(RunState(), None)
    running = after(pending, RUNNING_JOB)
    resuming = after(running, FAILED_JOB, PREEMPTED)
    later = NOW + timedelta(seconds=60)
    restarted = after(resuming, None, now=later)
    after(restarted, SUCCEEDED_JOB, AttemptRecords(), now=later)
    suspended = after(running, RUNNING_JOB, suspend=True)
    after(suspended, None)
    after(running, FAILED_JOB, BAD_INPUT)
    return seen


def test_every_declared_transition_is_one_the_plan_makes() -> None:
    made = _stories()
    unused = [t for t in RUN_TRANSITIONS if not any(b in t.sources and a == t.target for b, a in made)]
    assert not unused, f"declared but never made: {unused}"
    assert {(PENDING, RUNNING), (RUNNING, RESUMING), (RESUMING, PENDING), (RUNNING, SUSPENDED)} <= set(made)


def test_the_terminal_phases_are_never_left() -> None:
    for terminal in (SUCCEEDED, FAILED):
        assert all(terminal not in t.sources for t in RUN_TRANSITIONS)
        assert all(transition(terminal, other) is None for other in (PENDING, RUNNING, RESUMING, SUSPENDED))
    assert transition(SUSPENDED, RUNNING) is None  # an unsuspended run starts its next attempt first
