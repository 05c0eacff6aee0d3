"""The chaos campaign's full runs: the schedule keeps the rules its checks rely on; the restart checks judge."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.campaigns.chaos_runs import (
    BUDGET_SPENT,
    CLI_FAULTS,
    CLI_STOPS,
    FULL_RUN_KINDS,
    INTERVAL,
    MAX_STEPS,
    Fault,
    restart_problems,
    restarts,
    schedule,
)

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


def _events(path: Path, *events: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    return path


def test_a_notice_acted_on_without_an_emergency_checkpoint_fails_the_run_unless_s3_was_down(tmp_path: Path) -> None:
    # Chaos run 6 of 2026-11-29, as its events read: the notice acted on at step 28, S3 down since
    # step 22, so neither checkpoint-20 nor the emergency checkpoint completed; resumed from 10.
    events = _events(
        tmp_path / "events.jsonl",
        {"event": "start", "resumed_from": None},
        {"event": "step", "step": 10},
        {"event": "checkpoint_complete", "step": 10},
        {"event": "step", "step": 28},
        {"event": "preemption_notice", "step": 28},
        {"event": "start", "resumed_from": 10},
        {"event": "step", "step": 40},
    )
    found = restarts(events)
    assert found == [{"reached": 28, "resumed": 10, "complete": 10, "emergency": None, "noticed": 28}]
    assert restart_problems(found, [Fault("spot-notice", 11), Fault("s3-outage", 22)]) == []
    [problem] = restart_problems(found, [Fault("spot-notice", 11)])
    assert "step 28 left no emergency checkpoint" in problem
    assert "18 steps lost" in problem


def test_a_notice_with_its_emergency_checkpoint_resumes_from_it(tmp_path: Path) -> None:
    events = _events(
        tmp_path / "events.jsonl",
        {"event": "start", "resumed_from": None},
        {"event": "step", "step": 13},
        {"event": "checkpoint_complete", "step": 10},
        {"event": "preemption_notice", "step": 13},
        {"event": "emergency_checkpoint", "step": 13},
        {"event": "start", "resumed_from": 13},
    )
    assert restart_problems(restarts(events), [Fault("spot-notice", 11)]) == []
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    stale = _events(tmp_path / "stale.jsonl", *lines[:-1], {"event": "start", "resumed_from": 10})
    [problem] = restart_problems(restarts(stale), [Fault("spot-notice", 11)])
    assert problem == "resumed from 10, not the emergency checkpoint 13"
