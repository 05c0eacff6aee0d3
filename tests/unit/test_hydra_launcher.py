"""The Hydra launcher (plugins/hydra-spotray-launcher): Hydra's jobs -> a TrainingSweep -> each job's result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra_plugins.hydra_spotray_launcher.sweep_document import (
    PARAMETER,
    TRIAL_HYDRA_SETTINGS,
    default_sweep_name,
    job_line,
    job_results,
    sweep_document,
)

from spotray.contract.spec import name_problem
from spotray.contract.sweep import MAX_SWEEP_NAME_LENGTH, parse_sweep

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "jobs" / "gpt2" / "hydra_trainingrun.yaml"
JOBS = [["learning_rate=0.001", "max_steps=30"], ["learning_rate=0.003", "max_steps=30"]]


def template() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())
    return document


def test_each_job_is_one_trial_that_runs_the_template_entrypoint_with_the_job_overrides() -> None:
    document = sweep_document(template(), JOBS, name="gpt2-hydra", parallel=2)
    sweep = parse_sweep(document)  # the same checks as kubectl apply's and spotray run's
    assert (sweep.spec.search.algorithm, sweep.spec.trials.max_trials, sweep.spec.trials.parallel) == ("grid", 2, 2)
    [parameter] = sweep.spec.parameters
    assert parameter.values == ("learning_rate=0.001 max_steps=30", "learning_rate=0.003 max_steps=30")
    trial = sweep.trial_manifest(1, {PARAMETER: parameter.values[1]})
    assert trial["spec"]["entrypoint"] == (
        "python -m spotray.jobs.gpt2.hydra_app learning_rate=0.003 max_steps=30 "
        "hydra.output_subdir=null hydra.run.dir=. hydra/job_logging=stdout"
    ), "a trial leaves no outputs/ directory in the image's working directory"
    assert trial["spec"]["checkpoint"]["uri"] == "s3://spotray-demo/sweeps/hydra/gpt2-hydra-t1"
    assert sweep.spec.early_stopping is None, "every trial runs to its end unless asked"


def test_an_override_the_shell_would_split_or_expand_reaches_the_app_as_hydra_wrote_it() -> None:
    jobs = [["name='a b'", "tag=$HOME"]]
    document = sweep_document(template(), jobs, name="quoted")
    sweep = parse_sweep(document)
    entrypoint = sweep.trial_manifest(1, {PARAMETER: job_line(jobs[0])})["spec"]["entrypoint"]
    echo_argv = f"{sys.executable} -c 'import sys; print(sys.argv[1:])'"
    command = entrypoint.replace("python -m spotray.jobs.gpt2.hydra_app", echo_argv)
    argv = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
    assert argv.strip() == str(["name='a b'", "tag=$HOME", *TRIAL_HYDRA_SETTINGS])


def test_early_stopping_the_budget_and_the_namespace_come_through() -> None:
    named = template()
    named["metadata"]["namespace"] = "team-a"
    document = sweep_document(
        named, JOBS, name="asha", early_stopping_min_steps=10, reduction_factor=2, max_gpu_hours=1.5
    )
    sweep = parse_sweep(document)
    assert sweep.namespace == "team-a"
    assert sweep.spec.trials.max_gpu_hours == 1.5
    assert sweep.spec.early_stopping is not None
    assert sweep.spec.early_stopping.rungs(30) == [10, 20]


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"kind": "TrainingSweep"}, "must be a TrainingRun manifest"),
        ({"spec": {"workers": {"replicas": 1}}}, "spec.entrypoint is the command each trial runs"),
    ],
)
def test_a_template_that_is_no_training_run_is_refused_with_what_to_give(changed: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        sweep_document({**template(), **changed}, JOBS, name="x")


def test_two_jobs_alike_are_refused_rather_than_trained_twice() -> None:
    with pytest.raises(ValueError, match="two jobs have the same overrides"):
        sweep_document(template(), [JOBS[0], JOBS[0]], name="x")


def test_the_default_name_is_valid_and_the_same_for_the_same_jobs_only() -> None:
    name = default_sweep_name("hydra_app", JOBS)
    assert name_problem(name) is None
    assert name == default_sweep_name("hydra_app", [list(job) for job in JOBS]), "the same multirun goes on"
    assert name != default_sweep_name("hydra_app", JOBS[:1])
    long = default_sweep_name("My_Very Long.Training-Script_" * 4, JOBS)
    assert name_problem(long) is None
    assert len(long) <= MAX_SWEEP_NAME_LENGTH
    assert name_problem(default_sweep_name("9lives", JOBS)) is None
    assert name_problem(default_sweep_name("___", JOBS)) is None


def test_results_come_back_in_the_jobs_order_whatever_order_the_grid_ran_them() -> None:
    trials = [
        ("s-t1", {PARAMETER: job_line(JOBS[1])}, "Failed", None),
        ("s-t2", {PARAMETER: job_line(JOBS[0])}, "Succeeded", 2.5),
    ]
    first, second = job_results(JOBS, trials)
    assert (first.trial, first.state, first.value) == ("s-t2", "Succeeded", 2.5)
    assert (second.trial, second.state) == ("s-t1", "Failed")
    [unstarted] = job_results([["x=1"]], trials)
    assert (unstarted.trial, unstarted.state) == ("", "")


def test_hydra_finds_the_launcher_and_its_settings() -> None:
    shown = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "gpt2" / "hydra_app.py"), "hydra/launcher=spotray", "--cfg", "hydra"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    launcher = yaml.safe_load(shown)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("spotray_launcher.SpotrayLauncher")
    assert (launcher["local"], launcher["parallel"], launcher["template"]) == (True, 1, "???")
