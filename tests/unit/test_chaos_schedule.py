"""The chaos campaign's full-run schedule keeps the rules its checks rely on."""

from __future__ import annotations

import random

import pytest

from bench.chaos_runs import BUDGET_SPENT, CLI_FAULTS, CLI_STOPS, FULL_RUN_KINDS, INTERVAL, MAX_STEPS, schedule

pytestmark = pytest.mark.unit


def test_a_stop_of_the_command_comes_first_and_alone_and_local_mode_faults_once() -> None:
    rng = random.Random(7)
    for _ in range(500):
        faults = schedule(rng, FULL_RUN_KINDS)
        kinds = [fault.kind for fault in faults]
        steps = [fault.step for fault in faults]
        assert 1 <= len(faults) <= 2
        assert steps == sorted(set(steps)), "distinct steps, in order"
        assert all(3 <= step < MAX_STEPS - INTERVAL for step in steps), "early enough to land before training ends"
        assert sum(kind in CLI_STOPS for kind in kinds) <= 1
        assert not any(kind in CLI_STOPS for kind in kinds[1:]), "a stop comes first: the second command gets the rest"
        assert all(kinds.count(kind) == 1 for kind in kinds if kind in CLI_FAULTS)


def test_each_chosen_kind_leads_a_run_in_turn() -> None:
    choices = ["kill-worker-starting", "stop-cli-kill"]
    leads = [schedule(random.Random(n), choices, lead=choices[n % 2]) for n in range(6)]
    assert [{f.kind for f in faults} >= {choices[n % 2]} for n, faults in enumerate(leads)] == [True] * 6


def test_every_fault_has_a_budget_rule() -> None:
    assert set(FULL_RUN_KINDS) == set(BUDGET_SPENT)
    assert set(CLI_FAULTS) | set(CLI_STOPS) <= set(BUDGET_SPENT)
