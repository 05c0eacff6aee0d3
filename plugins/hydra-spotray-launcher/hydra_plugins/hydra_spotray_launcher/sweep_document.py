"""From Hydra's jobs to a TrainingSweep, and from the sweep's trials back to Hydra's job results.

Pure functions: no Hydra and no cluster here, so each is tested alone (tests/unit/test_hydra_launcher.py).

Hydra's sweeper has already expanded the command line into jobs (lists of overrides), so the sweep
does no search of its own: it has one parameter, ``overrides``, whose values are the jobs' override
strings, searched as a grid of exactly that many trials. Trial N runs the template's entrypoint with
its job's overrides appended; the sweep's controller (or ``spotray run SWEEP --local``) runs the
trials, as many at once as asked, stops the weak ones at rungs when early stopping is on, and keeps
each trial's checkpoints under a prefix of its own.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spotray.contract.names import API_VERSION, SWEEP_KIND
from spotray.contract.sweep import MAX_SWEEP_NAME_LENGTH

PARAMETER = "overrides"  # the sweep's one parameter: a job's overrides, as the shell passes them
HASH_CHARS = 8
# Appended to every trial's command: no Hydra output directory, the job's log on stdout.
TRIAL_HYDRA_SETTINGS = ("hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=stdout")


@dataclass(frozen=True)
class JobResult:
    """What became of one job's trial: its state (RUNNING, SUSPENDED, SUCCEEDED, FAILED), its objective."""

    overrides: tuple[str, ...]
    trial: str  # the trial's TrainingRun name ("" when the sweep never started it)
    state: str
    value: float | None = None


def job_line(overrides: Sequence[str]) -> str:
    """A job's overrides as one shell-quoted string (the parameter's value, appended to the entrypoint)."""
    return shlex.join(overrides)


def default_sweep_name(job_name: str, jobs: Sequence[Sequence[str]]) -> str:
    """The Hydra job's name made a valid sweep name, with a hash of the jobs: the same multirun again
    finds its sweep (and goes on with it), a different one gets a sweep of its own."""
    digest = hashlib.sha256("\n".join(job_line(job) for job in jobs).encode()).hexdigest()[:HASH_CHARS]
    stem = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-") or "hydra"
    stem = stem[: MAX_SWEEP_NAME_LENGTH - HASH_CHARS - 1].rstrip("-")
    if not stem[0].isalpha():
        stem = ("h" + stem)[: MAX_SWEEP_NAME_LENGTH - HASH_CHARS - 1]
    return f"{stem}-{digest}"


def sweep_document(
    template: dict[str, Any],
    jobs: Sequence[Sequence[str]],
    *,
    name: str,
    parallel: int = 1,
    early_stopping_min_steps: int | None = None,
    reduction_factor: int | None = None,
    max_gpu_hours: float | None = None,
) -> dict[str, Any]:
    """The TrainingSweep that runs ``jobs``: one trial each, from the TrainingRun manifest ``template``.

    The sweep goes to the template's namespace, if it names one. Raises ValueError when the template
    is no TrainingRun or two jobs are the same (a trial each would train the same thing twice)."""
    if not isinstance(template, dict) or template.get("kind") != "TrainingRun":
        raise ValueError("hydra.launcher.template: must be a TrainingRun manifest (kind: TrainingRun)")
    spec = copy.deepcopy(template.get("spec") or {})
    entrypoint = str(spec.get("entrypoint") or "").strip()
    if not entrypoint:
        raise ValueError("hydra.launcher.template: spec.entrypoint is the command each trial runs; it has none")
    lines = [job_line(job) for job in jobs]
    if len(set(lines)) != len(lines):
        repeated = sorted({line for line in lines if lines.count(line) > 1})
        raise ValueError(f"two jobs have the same overrides: {repeated}")
    # The entrypoint is a string.Template in a sweep: a $ of its own stays a $. A trial is one run of
    # the app: its log goes to the attempt's driver log, and no outputs/ directory is left in the
    # image's working directory.
    spec["entrypoint"] = f"{entrypoint.replace('$', '$$')} ${{{PARAMETER}}} {' '.join(TRIAL_HYDRA_SETTINGS)}"
    metadata: dict[str, Any] = {"name": name}
    namespace = (template.get("metadata") or {}).get("namespace")
    if namespace:
        metadata["namespace"] = namespace
    sweep_spec: dict[str, Any] = {
        "template": spec,
        "parameters": {PARAMETER: {"type": "choice", "values": lines}},
        "search": {"algorithm": "grid"},
        "objective": {"metric": "loss", "direction": "minimize"},
        "trials": {"max": len(lines), "parallel": parallel},
    }
    if max_gpu_hours is not None:
        sweep_spec["trials"]["maxGpuHours"] = max_gpu_hours
    if early_stopping_min_steps is not None:
        sweep_spec["earlyStopping"] = {"minSteps": early_stopping_min_steps}
        if reduction_factor is not None:  # else the TrainingSweep's own default (spotray/contract/sweep.py)
            sweep_spec["earlyStopping"]["reductionFactor"] = reduction_factor
    return {"apiVersion": API_VERSION, "kind": SWEEP_KIND, "metadata": metadata, "spec": sweep_spec}


def job_results(
    jobs: Sequence[Sequence[str]], trials: Sequence[tuple[str, dict[str, Any], str, float | None]]
) -> list[JobResult]:
    """Each job's result, in the jobs' order, from the trials (name, values, state, objective): a grid
    gives its trials in an order of its own, and each trial's values name its job."""
    by_line = {str(values.get(PARAMETER)): (name, state, value) for name, values, state, value in trials}
    results = []
    for job in jobs:
        name, state, value = by_line.get(job_line(job), ("", "", None))
        results.append(JobResult(tuple(job), name, state, value))
    return results
