"""Sweeps (issue 40): the TrainingSweep spec (spotray/contract/sweep.py) and the sweep's decisions
(spotray/decisions/sweep_plan.py: Optuna's samplers choose values, its successive-halving pruner judges rungs,
and a trial stopped at a rung is suspended, then resumed once it ranks among the best there)."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.cli.loss_plot import decision_marks
from spotray.cli.main import main
from spotray.cli.run_status import describe_sweep
from spotray.contract.names import SWEEP_LABEL
from spotray.contract.spec import InvalidSpecError, parse_training_run
from spotray.contract.status import IntervalLoss, LastCheckpoint
from spotray.contract.sweep import (
    OBJECTIVE_STEPS_ANNOTATION,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
    TRIAL_LABEL,
    EarlyStopping,
    TrainingSweep,
    gpu_hours,
    interval_mean,
    objective_steps,
    objective_values,
    parse_sweep,
    placeholders,
)
from spotray.controller.reconcile import merged_interval_losses
from spotray.controller.run_store import interval_losses_status
from spotray.decisions.sweep_plan import (
    decide,
    grid,
    promotable,
    rung_index,
    sweep_status,
    trial_limit,
    trial_patches,
)
from spotray.decisions.sweep_trials import FAILED, RUNNING, SUCCEEDED, SUSPENDED, TrialFacts, trial_facts
from spotray.local.local_sweep import (
    LocalSweep,
    SweepState,
    TrialProcess,
    attempt_seconds,
    complete_step,
    losses_by_step,
)
from spotray.local.progress import ProgressView
from spotray.train.records.plot import plot_sweep
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

SWEEP: dict[str, Any] = {
    "apiVersion": "spotray.dev/v1alpha1",
    "kind": "TrainingSweep",
    "metadata": {"name": "gpt2-lr", "namespace": "team-a"},
    "spec": {
        "template": {
            "entrypoint": "python -m spotray.jobs.gpt2 --max-steps 180 --learning-rate ${lr} --n-layer ${layers}",
            "checkpoint": {"uri": "s3://bucket/sweeps/gpt2-lr/", "everySteps": 10},
            "workers": {"replicas": 1, "gpu": 0},
        },
        "parameters": {
            "lr": {"type": "float", "low": 1.0e-5, "high": 1.0e-2, "log": True},
            "layers": {"type": "int", "values": [1, 2]},
        },
        "search": {"algorithm": "random", "seed": 7},
        "objective": {"metric": "loss", "direction": "minimize"},
        "trials": {"max": 9, "parallel": 3},
        "earlyStopping": {"minSteps": 20, "reductionFactor": 3},
    },
}


def sweep(**changes: Any) -> TrainingSweep:
    return changed_sweep(SWEEP, **changes)


def changed_sweep(base: dict[str, Any], **changes: Any) -> TrainingSweep:
    """``base`` with each change applied to its spec (``a__b``: spec.a.b; None removes it), parsed."""
    document = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = document["spec"]
        for key in parents:
            target = target[key]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return parse_sweep(document)


# -- the spec ---------------------------------------------------------------------------------------


def test_a_sweep_reads_with_its_defaults_and_its_template_checked_as_a_trainingrun_spec() -> None:
    parsed = sweep()
    assert (parsed.name, parsed.namespace) == ("gpt2-lr", "team-a")
    assert [p.name for p in parsed.spec.parameters] == ["lr", "layers"]
    assert parsed.spec.parameters[0].log
    assert parsed.spec.parameters[1].values == (1, 2)
    search, trials = parsed.spec.search, parsed.spec.trials
    assert (search.algorithm, search.seed, trials.max_trials, trials.parallel) == (
        "random",
        7,
        9,
        3,
    )
    assert parsed.spec.early_stopping == EarlyStopping(20, 3)
    assert parsed.spec.template.checkpoint.fixed_every_steps == 10
    assert EarlyStopping(20, 3).rungs(180) == [20, 60]


def test_each_trial_is_a_trainingrun_with_its_values_its_own_prefix_and_its_sweep_named() -> None:
    manifest = sweep().trial_manifest(4, {"lr": 0.0003, "layers": 2}, owner_uid="uid-1")
    run = parse_training_run(manifest)
    assert run.name == "gpt2-lr-t4"
    assert run.namespace == "team-a"
    assert run.spec.entrypoint.endswith("--learning-rate 0.0003 --n-layer 2")
    assert run.spec.checkpoint.uri == "s3://bucket/sweeps/gpt2-lr/gpt2-lr-t4"
    labels = manifest["metadata"]["labels"]
    assert (labels[SWEEP_LABEL], labels[TRIAL_LABEL]) == ("gpt2-lr", "4")
    assert json.loads(manifest["metadata"]["annotations"][PARAMS_ANNOTATION]) == {"layers": 2, "lr": 0.0003}
    [owner] = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "TrainingSweep",
        "gpt2-lr",
        "uid-1",
        True,
    )
    assert SWEEP["spec"]["template"]["checkpoint"]["uri"] == "s3://bucket/sweeps/gpt2-lr/", "the template is untouched"


def test_a_literal_dollar_stays_and_only_named_placeholders_count() -> None:
    assert placeholders("echo $$HOME ${lr} $layers") == {"lr", "layers"}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"parameters__lr": {"type": "float", "low": 0.1, "high": 0.01}}, "spec.parameters.lr: low and high must be"),
        ({"parameters__lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "a log scale needs low > 0"),
        ({"parameters__lr": {"type": "choice"}}, "a choice lists its values"),
        ({"parameters__lr": {"type": "fraction", "low": 0, "high": 1}}, "spec.parameters.lr.type: must be one of"),
        ({"parameters__lr": {"type": "int", "values": [1, "2"]}}, "every value must be an int"),
        ({"parameters__lr": {"type": "float", "values": [0.1, 0.1]}}, "each value once"),
        ({"parameters__lr": {"type": "int", "low": 1.5, "high": 3}}, "an int range has whole low and high"),
        (
            {"parameters__extra": {"type": "int", "low": 1, "high": 3}},
            "spec.parameters.extra: the entrypoint never uses it",
        ),
        ({"template__entrypoint": "python train.py ${lr} ${layers} ${dropout}"}, "${dropout} names no parameter"),
        ({"search__algorithm": "bayes"}, "spec.search.algorithm: must be one of grid, random, tpe"),
        ({"search__algorithm": "grid"}, "spec.parameters.lr: a grid lists every value"),
        ({"objective__metric": "accuracy"}, "spec.objective.metric: must be one of loss"),
        ({"trials__max": 0}, "spec.trials.max: must be an integer from 1 to 999"),
        ({"earlyStopping__minSteps": 25}, "must be a multiple of checkpoint.everySteps (10)"),
        ({"earlyStopping__reductionFactor": 1}, "reductionFactor: must be an integer from 2 to 100"),
        # Bounds in words as written, never in exponent form ("2.14748e+09" would hide the real limit).
        ({"search__seed": -1}, "spec.search.seed: must be an integer from 0 to 2147483647, got -1"),
        ({"earlyStopping__minSteps": 0}, "spec.earlyStopping.minSteps: must be an integer from 1 to 1000000000"),
        ({"template__checkpoint": {"uri": "s3://bucket/p", "everySteps": "auto"}}, "checkpoint.everySteps is auto"),
        ({"template__checkpoint": None}, "spec.template: spec.checkpoint: missing"),
        ({"parameters": None}, "spec.parameters: missing; name at least one"),
        ({"budget": {"gpuHours": 3}}, "spec.budget: unknown field"),
        ({"trials__maxGpuHours": 0}, "spec.trials.maxGpuHours: must be a number above 0, got 0"),
        ({"trials__maxGpuHours": "8h"}, "spec.trials.maxGpuHours: must be a number above 0, got '8h'"),
    ],
)
def test_a_wrong_sweep_is_refused_with_every_problem_and_its_place(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        sweep(**changes)
    assert any(said in problem for problem in refused.value.problems), refused.value.problems


def test_a_name_leaves_room_for_the_trial_number() -> None:
    document = copy.deepcopy(SWEEP)
    document["metadata"]["name"] = "s" * 38
    with pytest.raises(InvalidSpecError, match="at most 37 characters"):
        parse_sweep(document)


# -- the decisions ----------------------------------------------------------------------------------


def test_new_trials_fill_the_parallel_slots_with_values_that_do_not_change_when_asked_again() -> None:
    spec = sweep().spec
    first = decide(spec, [])
    assert [number for number, _ in first.start] == [1, 2, 3]
    assert decide(spec, []).start == first.start, "a controller that restarts asks for the same values"
    for _, values in first.start:
        assert 1e-5 <= values["lr"] <= 1e-2
        assert values["layers"] in (1, 2)
    assert len({v["lr"] for _, v in first.start}) == 3
    running = [TrialFacts(n, v, RUNNING) for n, v in first.start]
    assert decide(spec, running).start == [], "every slot is taken"
    done = [TrialFacts(1, first.start[0][1], SUCCEEDED, value=1.0), *running[1:]]
    assert [n for n, _ in decide(spec, done).start] == [4]


def test_tpe_chooses_too_and_a_grid_lists_every_combination_once() -> None:
    tpe = decide(sweep(search__algorithm="tpe").spec, [])
    assert [n for n, _ in tpe.start] == [1, 2, 3]
    spec = sweep(search__algorithm="grid", parameters__lr={"type": "float", "values": [0.001, 0.01]}).spec
    assert grid(spec.parameters) == [
        {"lr": 0.001, "layers": 1},
        {"lr": 0.001, "layers": 2},
        {"lr": 0.01, "layers": 1},
        {"lr": 0.01, "layers": 2},
    ]
    assert trial_limit(spec) == 4
    plan = decide(spec, [TrialFacts(n, v, SUCCEEDED, value=1.0) for n, v in enumerate(grid(spec.parameters)[:3], 1)])
    assert plan.start == [(4, {"lr": 0.01, "layers": 2})]
    everything = [TrialFacts(n, v, SUCCEEDED, value=float(n)) for n, v in enumerate(grid(spec.parameters), 1)]
    finished = decide(spec, everything)
    assert finished.finished
    assert finished.best == (1, 1.0)


def facts(number: int, state: str, rungs: dict[int, float], promoted: int | None = None) -> TrialFacts:
    return TrialFacts(number, {"lr": 0.001 * number, "layers": 1}, state, rungs, promoted_rung=promoted)


def test_the_rungs_are_numbered_as_the_pruner_numbers_them() -> None:
    early = EarlyStopping(20, 3)
    assert [rung_index(early, step) for step in (20, 60, 180)] == [0, 1, 2]
    with pytest.raises(ValueError, match="no rung"):
        rung_index(early, 40)


def test_a_trial_below_the_cut_at_a_rung_is_suspended_and_the_best_goes_on() -> None:
    spec = sweep().spec
    trials = [facts(1, RUNNING, {20: 1.0}, promoted=20), facts(2, RUNNING, {20: 2.0}), facts(3, RUNNING, {20: 3.0})]
    plan = decide(spec, trials)
    assert plan.suspend == [2, 3], "of three at the first rung, the best third goes on"
    assert 1 not in plan.promoted, "a promotion is for good: trial 1 is not judged at rung 20 again"
    assert plan.resume == []
    assert [n for n, _ in plan.start] == [4, 5], "their slots go to new trials"


def test_a_suspended_trial_is_promoted_later_once_enough_trials_reached_its_rung() -> None:
    spec = sweep(trials__parallel=1).spec
    # Trial 2 was second of two at rung 20 and stopped there; four more trials have reached it since,
    # all worse: now it ranks second of six, in the best third, and resumes (before any new trial).
    trials = [
        facts(1, SUCCEEDED, {20: 1.0, 60: 0.5}, promoted=60),
        facts(2, SUSPENDED, {20: 2.0}),
        *(facts(n, SUSPENDED, {20: 2.0 + n}) for n in range(3, 7)),
    ]
    assert promotable(spec, trials, trials[1], 20)
    assert not promotable(spec, trials, trials[2], 20)
    plan = decide(spec, trials)
    assert plan.resume == [2]
    assert plan.promoted == {2: 20}
    assert plan.start == [], "the one slot went to the promotion"
    assert plan.best is None, "trial 1 has no final objective yet"


def test_maximize_keeps_the_highest_and_a_sweep_ends_when_nothing_runs_or_can_resume() -> None:
    spec = sweep(objective__direction="maximize", trials__max=3).spec
    trials = [facts(1, RUNNING, {20: 1.0}), facts(2, RUNNING, {20: 5.0}, promoted=20), facts(3, RUNNING, {20: 3.0})]
    assert decide(spec, trials).suspend == [1, 3]
    over = [
        TrialFacts(1, {"lr": 0.001, "layers": 1}, SUSPENDED, {20: 1.0}),
        TrialFacts(2, {"lr": 0.002, "layers": 1}, SUCCEEDED, {20: 5.0}, value=7.0, promoted_rung=60),
        TrialFacts(3, {"lr": 0.003, "layers": 1}, SUSPENDED, {20: 3.0}),
    ]
    plan = decide(spec, over)
    assert (plan.resume, plan.start, plan.finished, plan.best) == ([], [], True, (2, 7.0))


def test_once_the_trials_spent_the_gpu_hours_nothing_starts_or_resumes_and_the_running_finish() -> None:
    spec = sweep(trials__parallel=2, trials__maxGpuHours=1.5).spec
    assert spec.trials.max_gpu_hours == 1.5
    trials = [
        dataclasses.replace(facts(1, RUNNING, {20: 1.0}, promoted=20), gpu_hours=0.9),
        dataclasses.replace(facts(2, SUSPENDED, {20: 2.0}), gpu_hours=0.3),
        dataclasses.replace(facts(3, SUSPENDED, {20: 3.0}), gpu_hours=0.2),
    ]
    under = decide(spec, trials)
    assert ([n for n, _ in under.start], under.budget_spent) == ([4], False), "1.4 of 1.5: a free slot is filled"
    trials[0] = dataclasses.replace(trials[0], gpu_hours=1.0)
    trials.append(dataclasses.replace(facts(4, SUSPENDED, {20: 0.5}), gpu_hours=0.0))  # the best at the rung
    spent = decide(spec, trials)
    assert (spent.start, spent.resume, spent.budget_spent, spent.finished) == ([], [], True, False), "1 runs on"
    assert 4 not in spent.promoted, "not resumed, so not recorded: a raised budget resumes it"
    raised = decide(dataclasses.replace(spec, trials=dataclasses.replace(spec.trials, max_gpu_hours=3.0)), trials)
    assert (raised.resume, raised.promoted) == ([4], {4: 20})
    trials.pop()
    trials[0] = dataclasses.replace(trials[0], state=SUCCEEDED, value=1.0)
    over = decide(spec, trials)
    assert (over.finished, over.best) == (True, (1, 1.0)), "nothing runs and nothing may: the sweep is over"
    assert sweep_status(spec, trials, over).gpu_hours == 1.5


def test_a_trials_gpu_hours_are_its_attempts_time_times_its_gpus() -> None:
    workers = sweep(template__workers={"replicas": 2, "gpu": 4}).spec.template.workers
    assert gpu_hours(workers, 1800) == 4.0, "8 GPUs for half an hour"
    assert gpu_hours(sweep().spec.template.workers, 3600) == 1.0, "a CPU-only worker counts as one"
    trial = trial_object(1, "Running", {})
    trial["status"]["attempts"] = [
        {"attempt": 1, "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:30:00Z"},
        {"attempt": 2, "startTime": "2026-01-01T01:00:00Z"},  # running: counted to now
    ]
    now = datetime(2026, 1, 1, 1, 15, tzinfo=UTC)
    read = trial_facts(sweep().spec, trial, now=now)
    assert read is not None
    assert read.gpu_hours == pytest.approx(0.75), "30 + 15 minutes, the hour between attempts not counted"
    # Local mode reads the same from a trial's event log: each attempt from its start to its last event.
    events = [
        {"event": "attempt_begun", "attempt": 1, "time": 100.0},
        {"event": "step", "step": 1, "time": 160.0},
        {"event": "attempt_begun", "attempt": 2, "time": 1000.0},
        {"event": "step", "step": 2, "time": 1030.0},
    ]
    assert attempt_seconds(events) == 90.0


# -- local mode's reading of a trial ----------------------------------------------------------------


def test_a_rung_counts_once_its_checkpoint_is_complete_with_the_mean_loss_of_its_interval() -> None:
    events: list[dict[str, Any]] = [{"event": "step", "step": s, "loss": float(s)} for s in range(1, 25)]
    events.append({"event": "checkpoint_complete", "step": 20})
    events += [{"event": "step", "step": 20, "loss": 100.0}]  # step 20 trained again after a resume: the latest counts
    losses = losses_by_step(events)
    assert interval_mean(losses, 10, 10) == 5.5
    assert objective_values(losses, [10, 20, 30], complete_step(events), 10) == {
        10: 5.5,
        20: (sum(range(11, 20)) + 100.0) / 10,
    }


def test_the_local_sweep_state_survives_a_round_trip() -> None:
    state = SweepState(values={1: {"lr": 0.001}}, promoted={1: 10}, suspended={2}, decisions=[(2, 10, "stopped")])
    assert SweepState.from_json(state.to_json()) == state


def test_the_sweep_plot_draws_every_trial_with_its_stops_and_promotions(tmp_path: Path) -> None:
    curves = {"t1": [(s, 5.0 - s / 10) for s in range(1, 31)], "t2": [(s, 5.0 - s / 20) for s in range(1, 31)]}
    png = plot_sweep(curves, [("t2", 10, "stopped"), ("t2", 10, "promoted")], tmp_path / "sweep.png", "a sweep")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_sweep_goes_to_the_cluster_without_local_and_refuses_what_only_a_run_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "jobs/gpt2/sweep.yaml", "--watch"]) == 2
    assert "--watch follows one TrainingRun, and this is a sweep" in capsys.readouterr().err
    assert main(["run", "jobs/gpt2/sweep.yaml", "--local", "--kill-all-at", "5"]) == 2
    assert "--kill-all-at applies to one local run" in capsys.readouterr().err


def test_the_example_sweep_reads_and_makes_trials_that_read_as_trainingruns() -> None:
    example = parse_sweep(yaml.safe_load((ROOT / "jobs/gpt2/sweep.yaml").read_text()))
    plan = decide(example.spec, [])
    assert [number for number, _ in plan.start] == [1, 2]
    run = parse_training_run(example.trial_manifest(1, plan.start[0][1]))
    assert f"--learning-rate {plan.start[0][1]['lr']!r}" in run.spec.entrypoint


def test_a_trial_whose_command_keeps_exiting_is_started_again_then_failed(tmp_path: Path) -> None:
    example = parse_sweep(yaml.safe_load((ROOT / "jobs/gpt2/sweep.yaml").read_text()))
    local = LocalSweep(example, tmp_path, progress=ProgressView())
    local.state.values[1] = {"lr": 0.001}
    states = []
    for _ in range(3):  # a command that cannot even start its run (here: it exits 2 at once)
        local.processes[1] = TrialProcess(1, subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"]))
        local.processes[1].process.wait()
        states.append(local._facts(1).state)
    assert states == [RUNNING, RUNNING, FAILED]


# -- the controller's reading of a trial's TrainingRun, and what it writes ---------------------------


def trial_object(
    number: int, phase: str, recorded: dict[int, float], *, suspend: bool = False, **annotations: str
) -> dict[str, Any]:
    """Trial ``number``'s TrainingRun as the API server holds it, its status written by the controller."""
    manifest = sweep().trial_manifest(number, {"lr": 0.001 * number, "layers": 1})
    manifest["metadata"]["annotations"].update(annotations)
    manifest["spec"]["suspend"] = suspend
    manifest["status"] = {
        "phase": phase,
        "progress": {"step": max(recorded, default=0), "totalSteps": 180},
        "intervalLosses": [{"step": step, "loss": loss} for step, loss in recorded.items()],
    }
    return manifest


def test_a_trainingrun_reads_as_the_trial_it_is() -> None:
    spec = sweep().spec
    annotations = trial_object(2, "Running", {})["metadata"]["annotations"]
    assert annotations[OBJECTIVE_STEPS_ANNOTATION].startswith("20,60,180,"), "every rung, whatever the step target"
    running = trial_facts(spec, trial_object(2, "Running", {20: 4.8, 60: 4.4}))
    assert running is not None
    assert (running.number, running.state, running.values) == (2, RUNNING, {"lr": 0.002, "layers": 1})
    assert running.rung_values == {20: 4.8, 60: 4.4}
    done = trial_facts(spec, trial_object(3, "Succeeded", {20: 4.8, 60: 4.4, 180: 3.9}, **{PROMOTED_ANNOTATION: "60"}))
    assert done is not None
    assert (done.state, done.promoted_rung, done.rung_values) == (SUCCEEDED, 60, {20: 4.8, 60: 4.4})
    assert done.value == 3.9, "the objective at its last step, which is no rung (180 = the step target)"
    stopped = trial_facts(spec, trial_object(4, "Suspended", {20: 4.9}, suspend=True, **{STOPPED_ANNOTATION: "20"}))
    held = trial_facts(spec, trial_object(5, "Suspended", {20: 4.9}, suspend=True))
    assert stopped is not None
    assert held is not None
    assert (stopped.state, stopped.held, held.state, held.held) == (SUSPENDED, False, SUSPENDED, True)
    stranger = trial_object(6, "Running", {})
    del stranger["metadata"]["annotations"][PARAMS_ANNOTATION]
    assert trial_facts(spec, stranger) is None, "not the sweep's to judge"


def test_a_trial_suspended_by_someone_else_is_never_resumed_by_the_sweep() -> None:
    spec = sweep(trials__parallel=1).spec
    trials = [
        facts(1, SUCCEEDED, {20: 1.0}, promoted=20),
        TrialFacts(2, {"lr": 0.002, "layers": 1}, SUSPENDED, {20: 0.5}, held=True),
    ]
    assert decide(spec, trials).resume == []


def test_the_patches_suspend_resume_and_record_the_rungs() -> None:
    spec = sweep(trials__parallel=1).spec
    trials = [
        facts(1, RUNNING, {20: 9.5}),  # fourth of six at the rung: below the best third
        facts(2, SUSPENDED, {20: 1.0}),  # first of six: promoted, into the slot trial 1 frees
        *(facts(n, SUSPENDED, {20: 5.0 + n}) for n in range(3, 7)),
    ]
    plan = decide(spec, trials)
    assert (plan.suspend, plan.resume) == ([1], [2])
    patches = trial_patches(sweep(trials__parallel=1), plan, trials)
    assert patches[1] == {"metadata": {"annotations": {STOPPED_ANNOTATION: "20"}}, "spec": {"suspend": True}}
    assert patches[2] == {
        "metadata": {"annotations": {PROMOTED_ANNOTATION: "20", STOPPED_ANNOTATION: None}},
        "spec": {"suspend": False},
    }
    status = sweep_status(spec, trials, plan).to_status()
    assert status["phase"] == "Running"
    assert status["trials"] == {"running": 1, "suspended": 5, "succeeded": 0, "failed": 0}
    assert (status["started"], status["limit"]) == (6, 9)
    done = [TrialFacts(1, {"lr": 0.001, "layers": 1}, SUCCEEDED, value=2.5)]
    finished = sweep_status(sweep(trials__max=1).spec, done, decide(sweep(trials__max=1).spec, done)).to_status()
    assert (finished["phase"], finished["best"]) == ("Succeeded", {"trial": 1, "loss": 2.5})


def test_a_trial_without_a_process_that_falls_below_the_cut_is_suspended_not_left_running(tmp_path: Path) -> None:
    """The sweep was stopped while trial 2 ran; started again, the trial is judged at its rung before it
    is started again: below the cut, it is marked suspended (no process to signal), so its slot is free."""
    example = parse_sweep(yaml.safe_load((ROOT / "jobs/gpt2/sweep.yaml").read_text()))
    local = LocalSweep(example, tmp_path, progress=ProgressView())
    local.state.values = {1: {"lr": 0.001}, 2: {"lr": 0.002}}
    facts = [
        TrialFacts(1, {"lr": 0.001}, SUCCEEDED, {10: 1.0}, value=0.5, promoted_rung=10),
        TrialFacts(2, {"lr": 0.002}, RUNNING, {10: 2.0}),
    ]
    plan = decide(example.spec, facts)
    assert plan.suspend == [2]
    local._act(dataclasses.replace(plan, start=[]), facts)
    assert local.state.suspended == {2}
    assert 2 not in local.processes, "not started again"


# -- what the TrainingRun reconcile records for a trial: status.intervalLosses -----------------------


def test_every_trial_asks_for_its_objective_and_other_runs_do_not() -> None:
    with_rungs = sweep().trial_manifest(1, {"lr": 0.001, "layers": 1})["metadata"]["annotations"]
    without = sweep(earlyStopping=None).trial_manifest(1, {"lr": 0.001, "layers": 1})["metadata"]["annotations"]
    assert objective_steps(with_rungs)[:3] == (20, 60, 180)
    assert objective_steps(without) == (), "no rungs: the last step's objective only"
    assert objective_steps({}) is None, "no sweep's trial"
    assert objective_steps({OBJECTIVE_STEPS_ANNOTATION: "x,20"}) == (), "unreadable: still a trial"


def test_a_trials_objective_is_recorded_at_its_rungs_once_checkpointed_and_at_its_last_step() -> None:
    resumed = AttemptProgress(attempt=2, run_id="uid", resumed_from=20, max_steps=90)
    resumed.points = [(step, float(step), 0.0) for step in range(21, 71)]
    at_60 = LastCheckpoint(step=60)
    found = interval_losses_status(resumed, [20, 60, 180], at_60, 20)
    # 20 was trained before this attempt's resume: its entry is the earlier attempt's, kept in the status.
    assert [(e.step, e.loss) for e in found] == [(60, sum(range(41, 61)) / 20)]
    assert interval_losses_status(resumed, [20, 60], at_60, None) == (), "no rung without a fixed interval"
    assert interval_losses_status(resumed, None, at_60, 20) == (), "no sweep's trial, nothing recorded"
    assert interval_losses_status(resumed, [], at_60, 20) == (), "a trial without rungs: not at its end yet"
    resumed.points += [(step, 1.0, 0.0) for step in range(71, 91)]
    ended = interval_losses_status(resumed, [20, 60, 180], LastCheckpoint(step=90), 20)
    assert [e.step for e in ended] == [60, 90], "the step target's too, once the final checkpoint is complete"
    # Found on the test bed (the Hydra launcher's sweep, no early stopping): a trial without rungs had
    # no objective recorded at all, so its sweep had no best and its job returned no loss.
    assert [e.step for e in interval_losses_status(resumed, [], LastCheckpoint(step=90), 20)] == [90]

    stored = (IntervalLoss(step=20, loss=5.0), IntervalLoss(step=60, loss=4.0))
    merged = merged_interval_losses(stored, ended)
    assert merged is not None
    assert [(e.step, e.loss) for e in merged] == [(20, 5.0), (60, ended[0].loss), (90, 1.0)]
    assert merged_interval_losses(stored, ()) is None, "nothing new: the stored entries stay as they are"


def test_spotray_plot_marks_where_the_sweep_stopped_or_promoted_each_trial() -> None:
    assert decision_marks("t2", {STOPPED_ANNOTATION: "20"}) == [("t2", 20, "stopped")]
    assert decision_marks("t1", {PROMOTED_ANNOTATION: "60", PARAMS_ANNOTATION: "{}"}) == [("t1", 60, "promoted")]
    assert decision_marks("t3", {STOPPED_ANNOTATION: "twenty"}) == [], "an annotation someone mangled: no mark"


def test_spotray_status_of_a_sweep_shows_each_trials_values_rungs_and_the_sweeps_decision() -> None:
    trials = [
        trial_object(1, "Succeeded", {20: 4.8, 60: 4.4, 180: 3.9}, **{PROMOTED_ANNOTATION: "60"}),
        trial_object(2, "Suspended", {20: 4.95}, suspend=True, **{STOPPED_ANNOTATION: "20"}),
    ]
    sweep_object = {
        "metadata": {"name": "gpt2-lr", "namespace": "team-a", "creationTimestamp": "2026-11-27T20:00:00Z"},
        "status": {
            "phase": "Running",
            "started": 2,
            "limit": 6,
            "trials": {"running": 0, "suspended": 1, "succeeded": 1, "failed": 0},
            "best": {"trial": 1, "loss": 3.9},
            "gpuHours": 0.42,
        },
        "spec": {"trials": {"max": 6, "maxGpuHours": 2}},
    }
    shown = describe_sweep(sweep_object, trials, now=datetime(2026, 11, 27, 21, tzinfo=UTC))
    assert "2 of 6 started (1 suspended, 1 succeeded)" in shown
    assert "GPU-hours: 0.42 spent of 2" in shown
    assert "trial 1 (loss 3.9)" in shown
    row_1 = next(line for line in shown.splitlines() if "gpt2-lr-t1" in line)
    assert "20: 4.8, 60: 4.4, 180: 3.9" in row_1
    assert "past 60" in row_1
    row_2 = next(line for line in shown.splitlines() if "gpt2-lr-t2" in line)
    assert "stopped at 20" in row_2
