"""Population-based training (issue 40): its spec section (spotray/contract/sweep.py) and its decisions
(spotray/decisions/sweep_plan.py: who is judged when, who exploits whom, the perturbed values, the patches that
stop a trial for its exploit and resume it from the donor's checkpoint)."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from spotray.cli.loss_plot import decision_marks
from spotray.cli.run_status import describe_sweep
from spotray.contract.spec import InvalidSpecError
from spotray.contract.status import IntervalLoss
from spotray.contract.sweep import (
    EXPLOIT_ANNOTATION,
    JUDGED_ANNOTATION,
    LINEAGE_ANNOTATION,
    OBJECTIVE_STEPS_ANNOTATION,
    PARAMS_ANNOTATION,
    Exploit,
    TrainingSweep,
)
from spotray.controller.reconcile import merged_interval_losses
from spotray.decisions.sweep_plan import decide, explore, sweep_status, trial_patches
from spotray.decisions.sweep_trials import FAILED, RUNNING, SUCCEEDED, SUSPENDED, TrialFacts, trial_facts
from spotray.local.local_sweep import current_life
from tests.unit.test_sweep import changed_sweep

pytestmark = pytest.mark.unit

PBT: dict[str, Any] = {
    "apiVersion": "spotray.dev/v1alpha1",
    "kind": "TrainingSweep",
    "metadata": {"name": "gpt2-pbt", "namespace": "team-a"},
    "spec": {
        "template": {
            "entrypoint": "python -m spotray.jobs.gpt2 --max-steps 100 --learning-rate ${lr} --n-layer ${layers}",
            "checkpoint": {"uri": "s3://bucket/sweeps/gpt2-pbt", "everySteps": 10},
        },
        "parameters": {
            "lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
            "layers": {"type": "int", "values": [1, 2, 4]},
        },
        "search": {"algorithm": "random", "seed": 3},
        "trials": {"max": 4, "parallel": 4},
        "populationBased": {"intervalSteps": 20, "quantile": 0.25, "resampleProbability": 0},
    },
}


def pbt(**changes: Any) -> TrainingSweep:
    return changed_sweep(PBT, **changes)


def trial(number: int, losses: dict[int, float], state: str = RUNNING, **known: Any) -> TrialFacts:
    return TrialFacts(number, {"lr": 0.001 * number, "layers": 2}, state, losses, **known)


def population(losses: dict[int, dict[int, float]]) -> list[TrialFacts]:
    return [trial(number, by_step) for number, by_step in losses.items()]


# -- the spec ---------------------------------------------------------------------------------------


def test_a_population_sweep_is_read_and_its_trials_are_compared_at_every_interval() -> None:
    sweep = pbt()
    assert sweep.spec.population is not None
    assert sweep.spec.population.interval_steps == 20
    assert sweep.spec.objective_steps(100) == [20, 40, 60, 80]
    annotations = sweep.trial_manifest(1, {"lr": 0.001, "layers": 2})["metadata"]["annotations"]
    steps = [int(step) for step in annotations[OBJECTIVE_STEPS_ANNOTATION].split(",")]
    assert steps[:3] == [20, 40, 60]
    assert len(steps) == 64, "bounded, as status.intervalLosses is"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"earlyStopping": {"minSteps": 20}}, "give earlyStopping or populationBased, not both"),
        ({"trials": {"max": 4, "parallel": 2}}, "trains the whole population at once: make it trials.max (4)"),
        ({"populationBased": {"intervalSteps": 25}}, "must be a multiple of checkpoint.everySteps (10), got 25"),
        (
            {"populationBased": {"intervalSteps": 20, "quantile": 0.7}},
            "quantile: must be a number above 0 and at most 0.5",
        ),
        (
            {"populationBased": {"intervalSteps": 20, "resampleProbability": 2}},
            "resampleProbability: must be a number from 0 to 1",
        ),
        ({"populationBased": {}}, "intervalSteps: missing"),
        ({"template__checkpoint__startFrom": "s3://bucket/x/checkpoint-10"}, "remove it from the template"),
    ],
)
def test_a_population_sweep_that_cannot_work_is_refused_with_the_fix(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        pbt(**changes)
    assert any(says in problem for problem in refused.value.problems), refused.value.problems


# -- the decisions ----------------------------------------------------------------------------------


def test_the_worst_trial_at_an_interval_exploits_the_best_and_the_others_go_on() -> None:
    spec = pbt().spec
    trials = population({1: {20: 1.0}, 2: {20: 2.0}, 3: {20: 3.0}, 4: {20: 4.0}})
    plan = decide(spec, trials)
    assert plan.judged == {1: 20, 2: 20, 3: 20}
    exploit = plan.exploit[4]
    assert (exploit.step, exploit.donor, exploit.donor_step) == (20, 1, 20)
    assert exploit.before == {"lr": 0.004, "layers": 2}
    assert exploit.values["lr"] in (0.0008, 0.0012), "the donor's 0.001 times 0.8 or 1.2"
    assert exploit.values["layers"] in (1, 4), "a neighbour of the donor's 2"
    assert decide(spec, trials).exploit == plan.exploit, "the same decision however often it is made"
    assert not plan.finished


def test_no_trial_is_judged_at_a_step_until_every_trial_training_has_reached_it() -> None:
    spec = pbt().spec
    trials = population({1: {20: 1.0, 40: 0.5}, 2: {20: 2.0, 40: 1.5}, 3: {20: 3.0}, 4: {20: 4.0, 40: 0.1}})
    plan = decide(spec, trials)
    assert set(plan.judged) | set(plan.exploit) == {1, 2, 3, 4}
    assert {exploit.step for exploit in plan.exploit.values()} | set(plan.judged.values()) == {20}, (
        "judged at 20, where all four are; not at 40, which trial 3 has not reached"
    )
    # Judged at 20 already: nothing more until trial 3 reaches 40.
    judged = [dataclasses.replace(t, judged_step=20) for t in trials]
    assert (decide(spec, judged).exploit, decide(spec, judged).judged) == ({}, {})
    # Trial 3 failed: it no longer holds the others back, and it competes nowhere.
    failed = [*judged[:2], dataclasses.replace(judged[2], state=FAILED), judged[3]]
    plan = decide(spec, failed)
    assert set(plan.exploit) | set(plan.judged) == {1, 2, 4}
    assert plan.exploit[2].donor == 4, "trial 4 leads at 40 with 0.1; trial 2 is last of three there"


def test_a_trial_that_exploited_is_judged_again_only_past_the_donors_step_and_never_holds_others_back() -> None:
    spec = pbt().spec
    jumped = trial(4, {20: 4.0}, judged_step=60)  # copied trial 1's checkpoint-60: past 40 without a value there
    trials = [trial(1, {20: 1.0, 40: 0.5}), trial(2, {20: 2.0, 40: 0.7}), trial(3, {20: 3.0, 40: 0.9}), jumped]
    trials = [dataclasses.replace(t, judged_step=t.judged_step or 20) for t in trials]
    plan = decide(spec, trials)
    assert set(plan.judged) | set(plan.exploit) == {1, 2, 3}, "trial 4 is not waited for at 40"
    assert plan.exploit[3].donor == 1


def test_a_population_maximizing_its_objective_exploits_the_lowest() -> None:
    spec = pbt(objective={"direction": "maximize"}).spec
    plan = decide(spec, population({1: {20: 1.0}, 2: {20: 2.0}, 3: {20: 3.0}, 4: {20: 4.0}}))
    assert list(plan.exploit) == [1]
    assert plan.exploit[1].donor == 4


def test_two_trials_are_a_population_and_one_alone_is_never_judged_against_itself() -> None:
    spec = pbt(trials={"max": 2, "parallel": 2}).spec
    plan = decide(spec, population({1: {20: 1.0}, 2: {20: 2.0}}))
    assert (list(plan.exploit), plan.judged) == ([2], {1: 20})
    alone = decide(spec, [trial(1, {20: 1.0}), trial(2, {}, state=FAILED)])
    assert (alone.exploit, alone.judged) == ({}, {1: 20})


def test_perturbed_values_stay_in_their_parameters_space() -> None:
    spec = pbt(
        parameters={
            "lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
            "layers": {"type": "int", "low": 1, "high": 3},
        },
        template__entrypoint="python -m spotray.jobs.gpt2 --learning-rate ${lr} --n-layer ${layers}",
        populationBased={"intervalSteps": 20, "resampleProbability": 0.5},
    ).spec
    seen = set()
    for seed in range(200):
        values = explore(spec, {"lr": 0.0099, "layers": 1}, random.Random(seed))
        assert 1.0e-4 <= values["lr"] <= 1.0e-2
        assert values["lr"] == float(f"{values['lr']:.6g}"), "6 significant digits: a tidy entrypoint"
        assert values["layers"] in (1, 2, 3)
        seen.add(values["layers"])
    assert seen == {1, 2, 3}, "an int of 1 moves by a whole step, and resampling reaches the whole range"


# -- acting on the trials -------------------------------------------------------------------------


def run_object(sweep: TrainingSweep, number: int, values: dict[str, Any], **change: Any) -> dict[str, Any]:
    """Trial ``number``'s TrainingRun as the API server returns it, with ``change`` applied as a merge patch."""
    run = sweep.trial_manifest(number, values, owner_uid="uid-1")
    run["status"] = {
        "phase": "Running",
        "intervalLosses": [{"step": 20, "loss": 4.0}],
        "progress": {"step": 25, "totalSteps": 100},
    }
    for key, value in change.get("annotations", {}).items():
        if value is None:
            run["metadata"]["annotations"].pop(key, None)
        else:
            run["metadata"]["annotations"][key] = value
    run["spec"].update(change.get("spec", {}))
    return run


def test_a_trial_is_stopped_for_its_exploit_then_resumed_from_the_donors_checkpoint_with_its_new_values() -> None:
    sweep = pbt()
    trials = population({1: {20: 1.0}, 2: {20: 2.0}, 3: {20: 3.0}, 4: {20: 4.0}})
    plan = decide(sweep.spec, trials)
    stop = trial_patches(sweep, plan, trials)[4]
    assert stop["spec"] == {"suspend": True}
    recorded = json.loads(stop["metadata"]["annotations"][EXPLOIT_ANNOTATION])
    assert Exploit.from_json(recorded) == plan.exploit[4]
    assert stop["metadata"]["annotations"][JUDGED_ANNOTATION] == "20"

    # The trial stopped on a checkpoint (its TrainingRun Suspended); the sweep resumes it with its exploit.
    stopped = run_object(sweep, 4, trials[3].values, **stop["metadata"], spec={"suspend": True})
    stopping = trial_facts(sweep.spec, stopped)  # its attempt still draining: resumed now, it could just go on
    assert stopping is not None
    assert (stopping.state, stopping.exploit) == (RUNNING, plan.exploit[4])
    assert decide(sweep.spec, [*trials[:3], stopping]).apply == {}
    stopped["status"]["phase"] = "Suspended"
    facts = trial_facts(sweep.spec, stopped)
    assert facts is not None
    assert (facts.state, facts.held, facts.exploit) == (SUSPENDED, False, plan.exploit[4])
    others = [t for t in trials if t.number != 4]
    resumed = decide(sweep.spec, [*others, facts])
    assert resumed.apply == {4: plan.exploit[4]}
    assert not resumed.finished
    patch = trial_patches(sweep, resumed, [*others, facts])[4]
    new = plan.exploit[4].values
    assert patch["spec"] == {
        "suspend": False,
        "entrypoint": sweep.trial_spec(4, new)["entrypoint"],
        "checkpoint": {"startFrom": "s3://bucket/sweeps/gpt2-pbt/gpt2-pbt-t1/checkpoint-20"},
    }
    assert f"--learning-rate {new['lr']!r}" in patch["spec"]["entrypoint"]
    annotations = patch["metadata"]["annotations"]
    assert json.loads(annotations[PARAMS_ANNOTATION]) == new
    assert annotations[EXPLOIT_ANNOTATION] is None
    assert annotations[JUDGED_ANNOTATION] == "20"
    lineage = json.loads(annotations[LINEAGE_ANNOTATION])
    applied = dataclasses.replace(plan.exploit[4], applied=lineage[0]["applied"])
    assert [Exploit.from_json(entry) for entry in lineage] == [applied], "with when it was applied"

    # Resumed: its values are the new ones, its lineage is one exploit, and the sweep counts it.
    running = run_object(sweep, 4, new, **patch["metadata"])
    after = trial_facts(sweep.spec, running)
    assert after is not None
    assert (after.state, after.values, after.lineage, after.exploit) == (RUNNING, new, (applied,), None)
    status = sweep_status(sweep.spec, [*others, after], decide(sweep.spec, [*others, after])).to_status()
    assert status["exploits"] == 1
    assert status["lineage"] == [{"trial": 4, "step": 20, "donor": 1, "donorStep": 20, "values": new}]


def test_a_trial_stopped_for_an_exploit_is_not_resumed_once_the_budget_is_spent() -> None:
    spec = pbt(trials={"max": 2, "parallel": 2, "maxGpuHours": 1}).spec
    exploit = Exploit(20, 1, 20, {"lr": 0.002}, {"lr": 0.0012, "layers": 2})
    trials = [
        trial(1, {20: 1.0}, state=SUCCEEDED, value=0.5, gpu_hours=0.6),
        trial(2, {20: 2.0}, state=SUSPENDED, exploit=exploit, gpu_hours=0.5),
    ]
    plan = decide(spec, trials)
    assert (plan.apply, plan.budget_spent, plan.finished) == ({}, True, True)


def test_an_unreadable_exploit_annotation_is_no_exploit() -> None:
    sweep = pbt()
    run = run_object(sweep, 2, {"lr": 0.001, "layers": 2}, annotations={EXPLOIT_ANNOTATION: "{not json"})
    run["spec"]["suspend"] = True
    facts = trial_facts(sweep.spec, run)
    assert facts is not None
    assert (facts.state, facts.exploit, facts.held) == (SUSPENDED, None, True), "someone else's suspension"


def test_spotray_status_and_plot_show_each_trials_exploits() -> None:
    sweep = pbt()
    exploit = Exploit(20, 1, 40, {"lr": 0.004, "layers": 2}, {"lr": 0.0012, "layers": 1})
    lineage = json.dumps([exploit.to_json()])
    trial_run = run_object(sweep, 4, exploit.values, annotations={LINEAGE_ANNOTATION: lineage})
    stopped = run_object(
        sweep, 3, {"lr": 0.003, "layers": 2}, annotations={EXPLOIT_ANNOTATION: json.dumps(exploit.to_json())}
    )
    document = {"metadata": {"name": "gpt2-pbt", "namespace": "team-a"}, "status": {"phase": "Running", "exploits": 1}}
    shown = describe_sweep(document, [trial_run, stopped])
    assert "Exploits:  1 (population-based training)" in shown
    assert "exploited t1@40 at 20 (lr=0.0012 layers=1)" in shown
    assert "exploiting t1@40 at 20" in shown
    assert decision_marks("t4", trial_run["metadata"]["annotations"]) == [("t4", 20, "exploited")]


# -- a trial's old life after an exploit --------------------------------------------------------------


def test_an_exploited_trials_values_past_the_donors_step_count_only_once_its_new_life_reported(tmp_path: Any) -> None:
    """Trial 2 ran ahead to step 40 before it was judged at 20 and exploited trial 1's checkpoint-20: its
    old value at 40 must not judge it again (found by the local campaign test: it exploited twice)."""
    sweep = pbt()
    applied = Exploit(20, 1, 20, {"lr": 0.002, "layers": 2}, {"lr": 0.0012, "layers": 2}, "2026-11-28T05:00:00Z")
    annotations = {LINEAGE_ANNOTATION: json.dumps([applied.to_json()]), JUDGED_ANNOTATION: "20"}
    run = run_object(sweep, 2, applied.values, annotations=annotations)
    run["status"]["intervalLosses"] = [{"step": 20, "loss": 4.0}, {"step": 40, "loss": 3.9}]
    run["status"]["attempts"] = [{"attempt": 1, "startTime": "2026-11-28T04:58:00Z", "resumedFrom": None}]
    facts = trial_facts(sweep.spec, run)
    assert facts is not None
    assert facts.rung_values == {20: 4.0}, "the old life's step 40 is dropped"
    # Its new attempt began after the exploit and said where it resumed: its entries are its new life's.
    run["status"]["attempts"].append({"attempt": 2, "startTime": "2026-11-28T05:00:03Z", "resumedFrom": 20})
    facts = trial_facts(sweep.spec, run)
    assert facts is not None
    assert facts.rung_values == {20: 4.0, 40: 3.9}


def test_a_resume_drops_the_stored_objective_of_every_step_after_it() -> None:
    stored = (IntervalLoss(step=20, loss=4.0), IntervalLoss(step=40, loss=3.9))
    assert merged_interval_losses(stored, (), resumed_from=20) == (IntervalLoss(step=20, loss=4.0),)
    assert merged_interval_losses(stored, (), resumed_from=40) is None, "nothing dropped, nothing new"
    found = (IntervalLoss(step=40, loss=3.5),)
    assert merged_interval_losses(stored, found, resumed_from=20) == (stored[0], found[0])


def test_locally_the_old_lifes_steps_past_the_donors_step_go_until_the_copy_and_after_it_count() -> None:
    uri = "s3://bucket/sweeps/gpt2-pbt/gpt2-pbt-t1/checkpoint-20"
    old = [{"event": "step", "step": step, "loss": 1.0} for step in (10, 20, 30, 40)]
    assert [e["step"] for e in current_life(old, uri, 20)] == [10, 20], "before its job copied the donor's"
    new = [{"event": "started_from", "uri": uri, "step": 20}, {"event": "step", "step": 21, "loss": 0.5}]
    assert [e.get("step") for e in current_life(old + new, uri, 20)] == [10, 20, 20, 21]


def test_the_resume_patch_records_when_the_exploit_was_applied() -> None:
    sweep = pbt()
    exploit = Exploit(20, 1, 20, {"lr": 0.004, "layers": 2}, {"lr": 0.0012, "layers": 2})
    stopped = trial(2, {20: 2.0}, state=SUSPENDED, exploit=exploit)
    trials = [trial(1, {20: 1.0}), stopped]
    plan = decide(sweep.spec, trials)
    now = datetime(2026, 11, 28, 5, 0, 0, tzinfo=UTC)
    patch = trial_patches(sweep, plan, trials, now)[2]
    [recorded] = json.loads(patch["metadata"]["annotations"][LINEAGE_ANNOTATION])
    assert recorded["applied"] == "2026-11-28T05:00:00Z"


def test_a_trial_about_to_take_anothers_checkpoint_is_no_donor() -> None:
    """Its own checkpoints are replaced when its copy runs: a trial that copied from it then would find none."""
    spec = pbt().spec
    pending = Exploit(20, 2, 20, {"lr": 0.001, "layers": 2}, {"lr": 0.0024, "layers": 2})
    others = population({2: {20: 2.0, 40: 2.0}, 3: {20: 3.0, 40: 3.0}, 4: {20: 4.0, 40: 4.0}})
    trials = [trial(1, {20: 1.0, 40: 0.5}, exploit=pending), *others]
    plan = decide(spec, trials)
    assert plan.exploit == {}, "the best at 40 is stopping for its own exploit: nobody takes its checkpoint"
    assert set(plan.judged) == {2, 3, 4}
