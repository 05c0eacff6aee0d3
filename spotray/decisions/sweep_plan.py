"""A sweep's decisions as a pure function: the trials' facts -> which trials to start, stop or resume.

The search itself is Optuna's: its random and TPE samplers choose each new trial's values, and its
successive-halving pruner judges a trial at a rung (a step ``minSteps * factor^k``, on a checkpoint).
A grid is every combination of the parameters' values, in the order they are declared.

Optuna does not suspend and resume trials: its pruner decides once, when a trial reports at a rung.
Here a trial that does not make the cut is suspended (its TrainingRun's ``spec.suspend``: it stops on
a checkpoint and keeps everything), and the pruner's rule is applied to it again each time the sweep
decides, with every trial that has since reached that rung among the competitors: once it ranks
among the best 1/factor there, it is promoted and resumes from its newest complete checkpoint, as
asynchronous successive halving (ASHA) promotes. A promotion is for good (``TrialFacts.promoted_rung``
records it), so a trial is never stopped at a rung it was let past.

Nothing is kept between calls: the study is rebuilt from the trials' facts every time, and each new
trial's values come from a sampler seeded with the sweep's seed and the trial's number, so a
controller that restarts (or decides twice) asks for the same values for the same trial.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spotray.contract.extras import extra_required
from spotray.contract.names import FAILED as FAILED_PHASE
from spotray.contract.names import RUNNING as RUNNING_PHASE
from spotray.contract.names import SUCCEEDED as SUCCEEDED_PHASE
from spotray.contract.status import format_date_time
from spotray.contract.sweep import (
    EXPLOIT_ANNOTATION,
    JUDGED_ANNOTATION,
    LINEAGE_ANNOTATION,
    MAX_LINEAGE,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
    EarlyStopping,
    Exploit,
    Parameter,
    SweepSpec,
    TrainingSweep,
    format_value,
)
from spotray.contract.sweep_status import MAX_STATUS_LINEAGE, BestTrial, LineageEntry, SweepStatus, TrialCounts
from spotray.decisions.sweep_trials import FAILED, RUNNING, SUCCEEDED, SUSPENDED, TrialFacts, spent_gpu_hours

with extra_required("sweep"):
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.pruners import SuccessiveHalvingPruner
    from optuna.samplers import BaseSampler, RandomSampler, TPESampler
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial, TrialState, create_trial

# TPE's first trials are random: it needs a few results to model (Optuna's default is 10).
TPE_STARTUP_TRIALS = 4

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class SweepPlan:
    start: list[tuple[int, dict[str, Any]]]  # new trials: (number, values)
    suspend: list[int]  # trials stopped at a rung: (number)
    resume: list[int]  # suspended trials promoted
    promoted: dict[int, int]  # trial -> the rung step it was let past, to record
    best: tuple[int, float] | None  # (trial, objective) of the best trial that Succeeded
    finished: bool  # nothing runs and nothing more will start or resume
    budget_spent: bool = False  # the trials spent spec.trials.maxGpuHours: none starts or resumes
    # Population-based training: trials to stop for an exploit; stopped ones to resume with theirs; trials
    # judged at a step and left as they are (the step recorded, so they are judged there once).
    exploit: dict[int, Exploit] = field(default_factory=dict)
    apply: dict[int, Exploit] = field(default_factory=dict)
    judged: dict[int, int] = field(default_factory=dict)


def distributions(parameters: Sequence[Parameter]) -> dict[str, BaseDistribution]:
    """The search space as Optuna's distributions."""
    space: dict[str, BaseDistribution] = {}
    for parameter in parameters:
        if parameter.values:
            space[parameter.name] = CategoricalDistribution(list(parameter.values))
        elif parameter.type == "int":
            assert parameter.low is not None
            assert parameter.high is not None
            space[parameter.name] = IntDistribution(int(parameter.low), int(parameter.high), log=parameter.log)
        else:
            assert parameter.low is not None
            assert parameter.high is not None
            space[parameter.name] = FloatDistribution(parameter.low, parameter.high, log=parameter.log)
    return space


def grid(parameters: Sequence[Parameter]) -> list[dict[str, Any]]:
    """Every combination of the parameters' values, the last parameter changing fastest."""
    names = [p.name for p in parameters]
    return [
        dict(zip(names, combination, strict=True)) for combination in itertools.product(*(p.grid() for p in parameters))
    ]


def trial_limit(spec: SweepSpec) -> int:
    """How many trials the sweep starts in all: ``trials.max``, or fewer when a grid has fewer points."""
    if spec.search.algorithm == "grid":
        return min(spec.trials.max_trials, len(grid(spec.parameters)))
    return spec.trials.max_trials


def _sampler(spec: SweepSpec, number: int) -> BaseSampler:
    seed = spec.search.seed * 1_000_003 + number  # one seed per trial: the same values for the same trial, always
    if spec.search.algorithm == "tpe":
        return TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS, constant_liar=True)
    return RandomSampler(seed=seed)


def _frozen(spec: SweepSpec, trial: TrialFacts, rungs: dict[int, float]) -> FrozenTrial:
    """The trial as Optuna records one, with ``rungs`` (its objective at those rung steps) reported."""
    state = {
        SUCCEEDED: TrialState.COMPLETE,
        FAILED: TrialState.FAIL,
        SUSPENDED: TrialState.PRUNED,
        RUNNING: TrialState.RUNNING,
    }[trial.state]
    if state == TrialState.COMPLETE and (trial.value is None or not math.isfinite(trial.value)):
        state = TrialState.RUNNING  # its objective not read yet: its values are taken, its result unknown
    return create_trial(
        state=state,
        value=trial.value if state == TrialState.COMPLETE else None,
        params=trial.values,
        distributions=distributions(spec.parameters),
        intermediate_values=dict(rungs),
        system_attrs=_rung_keys(spec.early_stopping, rungs),
    )


def _rung_keys(early: EarlyStopping | None, rungs: dict[int, float]) -> dict[str, float]:
    """The pruner's own record of the rungs a trial reached: completed_rung_<k> for the k-th rung."""
    if early is None:
        return {}
    return {f"completed_rung_{rung_index(early, step)}": value for step, value in rungs.items()}


def rung_index(early: EarlyStopping, step: int) -> int:
    """Which rung ``step`` is (0 for ``minSteps``); a step that is no rung is refused."""
    steps = early.rungs(step + 1)
    if not steps or steps[-1] != step:
        raise ValueError(f"step {step} is no rung of {early}")
    return len(steps) - 1


def _study(spec: SweepSpec, trials: Sequence[TrialFacts], sampler: BaseSampler | None = None) -> optuna.Study:
    pruner = (
        SuccessiveHalvingPruner(
            min_resource=spec.early_stopping.min_steps, reduction_factor=spec.early_stopping.reduction_factor
        )
        if spec.early_stopping is not None
        else None
    )
    direction = StudyDirection.MAXIMIZE if spec.objective.direction == "maximize" else StudyDirection.MINIMIZE
    study = optuna.create_study(direction=direction, sampler=sampler or RandomSampler(0), pruner=pruner)
    for trial in trials:
        study.add_trial(_frozen(spec, trial, trial.rung_values))
    return study


def promotable(spec: SweepSpec, trials: Sequence[TrialFacts], trial: TrialFacts, rung: int) -> bool:
    """Whether ``trial`` goes on past the rung at step ``rung``: Optuna's pruner judges it there, with
    every other trial that reached that rung as a competitor."""
    assert spec.early_stopping is not None
    others = [t for t in trials if t.number != trial.number]
    study = _study(spec, others)
    below = {step: value for step, value in trial.rung_values.items() if step < rung}
    # Reported at the rung, with the rungs below it already passed: the pruner compares it there.
    study.add_trial(
        create_trial(
            state=TrialState.RUNNING,
            params=trial.values,
            distributions=distributions(spec.parameters),
            intermediate_values={**below, rung: trial.rung_values[rung]},
            system_attrs=_rung_keys(spec.early_stopping, below),
        )
    )
    judged = study.get_trials(deepcopy=False)[-1]
    return not study.pruner.prune(study, judged)


def decide(spec: SweepSpec, trials: Sequence[TrialFacts]) -> SweepPlan:
    """What the sweep does next, from its trials' facts alone."""
    suspend, resume, promoted = [], [], {}
    if spec.early_stopping is not None:
        for trial in sorted(trials, key=lambda t: t.number):
            reached = [step for step in trial.rung_values if trial.promoted_rung is None or step > trial.promoted_rung]
            if trial.state not in (RUNNING, SUSPENDED) or trial.held or not reached:
                continue
            rung = max(reached)
            if promotable(spec, trials, trial, rung):
                promoted[trial.number] = rung
                if trial.state == SUSPENDED:
                    resume.append(trial.number)
            elif trial.state == RUNNING:
                suspend.append(trial.number)
    exploit, judged = population_decisions(spec, trials) if spec.population is not None else ({}, {})
    running = sum(1 for t in trials if t.state == RUNNING and t.number not in suspend)
    spent = spec.trials.max_gpu_hours is not None and spent_gpu_hours(trials) >= spec.trials.max_gpu_hours
    # Promotions first (ASHA): a free slot goes to a trial that earned it before a new one. With the
    # budget spent, the trials running finish and nothing else runs.
    slots = 0 if spent else max(0, spec.trials.parallel - running)
    # A trial stopped for its exploit goes on with it (PBT trains the whole population at once).
    pending = sorted(t.number for t in trials if t.state == SUSPENDED and t.exploit is not None)[:slots]
    apply = {t.number: t.exploit for t in trials if t.number in pending and t.exploit is not None}
    slots -= len(apply)
    for number in resume[slots:]:
        # Not resumed now: its promotion is not recorded either, so it is judged again (and resumed)
        # once a slot is free, or the budget raised. A recorded promotion is never judged again.
        del promoted[number]
    resume = resume[:slots]
    slots -= len(resume)
    start = _new_trials(spec, trials, slots)
    out_of_trials = spent or _started(trials) >= trial_limit(spec)
    finished = not start and not resume and not apply and running == 0 and out_of_trials
    return SweepPlan(start, suspend, resume, promoted, best(spec, trials), finished, spent, exploit, apply, judged)


def population_decisions(spec: SweepSpec, trials: Sequence[TrialFacts]) -> tuple[dict[int, Exploit], dict[int, int]]:
    """Population-based training's judgments: which running trials exploit another now, and which were
    judged and go on as they are.

    A trial is judged at the newest interval step it reached (in a complete checkpoint) past the one it
    was last judged at, once every trial still training has reached that step too, so it is ranked
    against the whole population there. Ranked by the objective there, the bottom ``quantile`` (at
    least one trial, at most half) each take a trial of the top quantile as donor (chosen by a generator
    seeded with the sweep's seed, the trial and the step: the same decision however often it is made):
    the donor's newest compared checkpoint and its values, perturbed (``explore``).
    """
    assert spec.population is not None
    exploits: dict[int, Exploit] = {}
    judged: dict[int, int] = {}
    training = [t for t in trials if (t.state == RUNNING and not t.held) or t.exploit is not None]
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state != RUNNING or trial.held or trial.exploit is not None:
            continue
        ready = [
            step
            for step in trial.rung_values
            if step > (trial.judged_step or 0) and all(_reached(other, step) for other in training)
        ]
        if not ready:
            continue
        step = max(ready)
        ranked = sorted(
            (t for t in trials if t.state != FAILED and step in t.rung_values),
            key=lambda t: t.rung_values[step] if spec.objective.direction == "minimize" else -t.rung_values[step],
        )
        count = min(len(ranked) // 2, max(1, int(len(ranked) * spec.population.quantile)))
        bottom = {t.number for t in ranked[len(ranked) - count :]} if count else set()
        # A donor about to take another's checkpoint would have its own replaced under the copy: not one.
        donors = [t for t in ranked[:count] if t.exploit is None]
        if trial.number not in bottom or not donors:
            judged[trial.number] = step
            continue
        generator = random.Random(f"{spec.search.seed}/{trial.number}/{step}")  # noqa: S311 - seeded, reproducible; no secret
        donor = generator.choice(donors)
        values = explore(spec, donor.values, generator)
        exploits[trial.number] = Exploit(step, donor.number, max(donor.rung_values), trial.values, values)
    return exploits, judged


def _reached(trial: TrialFacts, step: int) -> bool:
    """Whether ``trial`` is at or past ``step``: compared there, or gone past it (by an exploit)."""
    return max(trial.rung_values, default=0) >= step or (trial.judged_step or 0) >= step


# Ray Tune's PopulationBasedTraining perturbs a value by these factors; the same here.
PERTURB_FACTORS = (0.8, 1.2)


def explore(spec: SweepSpec, values: dict[str, Any], generator: random.Random) -> dict[str, Any]:
    """The donor's ``values``, perturbed: each resampled from its parameter's space with
    ``resampleProbability``, else a range's value times 0.8 or 1.2 (within its bounds) and a listed
    value one of its neighbours in the list."""
    assert spec.population is not None
    perturbed: dict[str, Any] = {}
    for parameter in spec.parameters:
        value = values.get(parameter.name)
        listed = [format_value(v) for v in parameter.values]
        resample = generator.random() < spec.population.resample_probability
        if resample or value is None or (parameter.values and format_value(value) not in listed):
            perturbed[parameter.name] = _sample(parameter, generator)
        elif parameter.values:
            index = listed.index(format_value(value)) + generator.choice((-1, 1))
            perturbed[parameter.name] = parameter.values[min(max(index, 0), len(listed) - 1)]
        else:
            perturbed[parameter.name] = _scaled(parameter, float(value), generator.choice(PERTURB_FACTORS))
    return perturbed


def _sample(parameter: Parameter, generator: random.Random) -> Any:
    if parameter.values:
        return generator.choice(parameter.values)
    assert parameter.low is not None
    assert parameter.high is not None
    if parameter.log:
        value = math.exp(generator.uniform(math.log(parameter.low), math.log(parameter.high)))
    else:
        value = generator.uniform(parameter.low, parameter.high)
    return _in_range(parameter, value)


def _scaled(parameter: Parameter, value: float, factor: float) -> Any:
    scaled = _in_range(parameter, value * factor)
    if parameter.type == "int" and scaled == value:  # an int too small to move by 20%: one step instead
        scaled = _in_range(parameter, value + (1 if factor > 1 else -1))
    return scaled


def _in_range(parameter: Parameter, value: float) -> Any:
    """``value`` within the parameter's bounds; an int rounded, a float to 6 significant digits (a value
    the entrypoint shows as 0.0012, not 0.0012000000000000001)."""
    assert parameter.low is not None
    assert parameter.high is not None
    value = min(max(value, parameter.low), parameter.high)
    return round(value) if parameter.type == "int" else float(f"{value:.6g}")


def _started(trials: Sequence[TrialFacts]) -> int:
    return max((t.number for t in trials), default=0)


def _new_trials(spec: SweepSpec, trials: Sequence[TrialFacts], slots: int) -> list[tuple[int, dict[str, Any]]]:
    """Up to ``slots`` new trials, numbered after the last one started, while the sweep has trials left."""
    numbers = range(_started(trials) + 1, min(_started(trials) + slots, trial_limit(spec)) + 1)
    if spec.search.algorithm == "grid":
        points = grid(spec.parameters)
        return [(number, points[number - 1]) for number in numbers]
    chosen: list[tuple[int, dict[str, Any]]] = []
    known = list(trials)
    for number in numbers:
        study = _study(spec, known, _sampler(spec, number))
        values = study.ask(distributions(spec.parameters)).params
        chosen.append((number, values))
        known.append(TrialFacts(number, values, RUNNING))  # the next one's sampler sees it as running
    return chosen


def trial_patches(
    sweep: TrainingSweep, plan: SweepPlan, facts: Sequence[TrialFacts], now: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """The merge patch of each trial's TrainingRun the plan changes: stopped at a rung (suspended, and
    the rung recorded), promoted (the rung it was let past recorded; resumed if it was suspended);
    with population-based training, judged (the step recorded), stopped for an exploit (suspended, the
    exploit recorded), and resumed with it (its values, entrypoint and checkpoint.startFrom, the
    exploit moved to its lineage)."""
    patches: dict[int, dict[str, Any]] = {}
    for number, step in plan.judged.items():
        patches[number] = {"metadata": {"annotations": {JUDGED_ANNOTATION: str(step)}}}
    for number, exploit in plan.exploit.items():
        exploit_json = json.dumps(exploit.to_json(), sort_keys=True)
        annotations = {JUDGED_ANNOTATION: str(exploit.step), EXPLOIT_ANNOTATION: exploit_json}
        patches[number] = {"metadata": {"annotations": annotations}, "spec": {"suspend": True}}
    for number, exploit in plan.apply.items():
        applied = dataclasses.replace(exploit, applied=format_date_time(now or datetime.now(UTC)))
        patches[number] = exploit_patch(sweep, next(f for f in facts if f.number == number), applied)
    for number in plan.suspend:
        rung = max(next(f for f in facts if f.number == number).rung_values)
        patches[number] = {"metadata": {"annotations": {STOPPED_ANNOTATION: str(rung)}}, "spec": {"suspend": True}}
    for number, rung in plan.promoted.items():
        patch = patches.setdefault(number, {"metadata": {"annotations": {}}})
        patch["metadata"]["annotations"][PROMOTED_ANNOTATION] = str(rung)
        if number in plan.resume:
            patch["metadata"]["annotations"][STOPPED_ANNOTATION] = None  # a merge patch removes it
            patch["spec"] = {"suspend": False}
    return patches


def exploit_patch(sweep: TrainingSweep, trial: TrialFacts, exploit: Exploit) -> dict[str, Any]:
    """A trial stopped for ``exploit`` resumed with it: the donor's checkpoint to start from, the new
    values in its entrypoint and annotation, the exploit in its lineage, judged up to the donor's step."""
    lineage = [*(e.to_json() for e in trial.lineage), exploit.to_json()][-MAX_LINEAGE:]
    annotations = {
        PARAMS_ANNOTATION: json.dumps(exploit.values, sort_keys=True),
        EXPLOIT_ANNOTATION: None,  # a merge patch removes it
        LINEAGE_ANNOTATION: json.dumps(lineage, sort_keys=True),
        JUDGED_ANNOTATION: str(exploit.donor_step),
    }
    spec = {
        "suspend": False,
        "entrypoint": sweep.trial_spec(trial.number, exploit.values)["entrypoint"],
        "checkpoint": {"startFrom": sweep.donor_checkpoint(exploit)},
    }
    return {"metadata": {"annotations": annotations}, "spec": spec}


def sweep_status(spec: SweepSpec, facts: Sequence[TrialFacts], plan: SweepPlan) -> SweepStatus:
    """The sweep's status: its phase, its trials by state, the best so far, how many of its trials started."""
    phase = RUNNING_PHASE if not plan.finished else (SUCCEEDED_PHASE if plan.best is not None else FAILED_PHASE)
    counts = {
        state.lower(): sum(1 for f in facts if f.state == state) for state in (RUNNING, SUSPENDED, SUCCEEDED, FAILED)
    }
    status = SweepStatus(
        phase=phase,
        trials=TrialCounts(**counts),
        started=max((f.number for f in facts), default=0) + len(plan.start),
        limit=trial_limit(spec),
        best=None if plan.best is None else BestTrial(trial=plan.best[0], loss=round(plan.best[1], 6)),
        gpu_hours=round(spent_gpu_hours(facts), 2),  # whole 36 s: a running trial rewrites it rarely
    )
    if spec.population is None:
        return status
    # The population's lineage: every exploit applied (the newest MAX_STATUS_LINEAGE), in the order made.
    lineage = sorted(((e.applied or "", f.number, e) for f in facts for e in f.lineage), key=lambda x: x[:2])
    return dataclasses.replace(
        status,
        exploits=sum(len(f.lineage) for f in facts),
        lineage=tuple(
            LineageEntry(trial=number, step=e.step, donor=e.donor, donor_step=e.donor_step, values=e.values)
            for _, number, e in lineage[-MAX_STATUS_LINEAGE:]
        ),
    )


def best(spec: SweepSpec, trials: Sequence[TrialFacts]) -> tuple[int, float] | None:
    """The trial that Succeeded with the best objective, and that objective."""
    done = [
        (t.value, t.number) for t in trials if t.state == SUCCEEDED and t.value is not None and math.isfinite(t.value)
    ]
    if not done:
        return None
    value, number = (min if spec.objective.direction == "minimize" else max)(done)
    return number, value
