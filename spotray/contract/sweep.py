"""The TrainingSweep spec as typed data: a TrainingRun template, a search space, an objective, early stopping.

A sweep is many TrainingRuns (its trials) made from one template, each with its own values of the
parameters. Each trial is an ordinary TrainingRun named ``<sweep>-t<N>``: it resumes after every
spot loss as any run does, its preemptions are its own and its failure budget too, and its
checkpoints go under its own prefix, ``<template's checkpoint.uri>/<sweep>-t<N>``. The values reach
the training code through the entrypoint, where ``${name}`` stands for each parameter::

    spec:
      template:
        entrypoint: python -m spotray.jobs.gpt2 --max-steps 200 --learning-rate ${lr}
        checkpoint: {uri: s3://bucket/sweeps/gpt2-lr, everySteps: 20}
      parameters:
        lr: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
        layers: {type: int, values: [1, 2, 4]}
      search: {algorithm: tpe, seed: 1}           # grid, random or tpe (Optuna's samplers)
      objective: {metric: loss, direction: minimize}
      trials: {max: 16, parallel: 4, maxGpuHours: 40}   # the budget: trials, and GPU-hours in all
      earlyStopping: {minSteps: 20, reductionFactor: 3}   # ASHA, at checkpoint boundaries

Each section is declared once, as a dataclass whose fields carry their description, default and
bounds (``sweep_field``): the parser, the CRD schema (controller/crd.py) and `kubectl explain` come
from the declarations. This module only reads and checks the spec (every problem at once, each with
its path and fix) and makes a trial's TrainingRun manifest; choosing values and stopping trials is
spotray/decisions/sweep_plan.py's. Standard library and PyYAML only, as the rest of the contract.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import string
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spotray.contract.errors import unknown_field
from spotray.contract.names import API_VERSION, KIND, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.spec import (
    MAX_NAME_LENGTH,
    InvalidSpecError,
    RunSpec,
    WorkerSpec,
    camel,
    field_type,
    name_problem,
    parse_spec,
)

SWEEP_PLURAL = "trainingsweeps"
TRIAL_LABEL = "spotray.dev/trial"  # on each trial: its number
PARAMS_ANNOTATION = "spotray.dev/params"  # on each trial: its values, as JSON
PROMOTED_ANNOTATION = "spotray.dev/promoted-rung"  # on a trial: the highest rung step it was let past
STOPPED_ANNOTATION = "spotray.dev/stopped-at-rung"  # on a trial the sweep suspended: the rung step it stopped at
# Population-based training, on a trial: the last step it was judged at; the exploit it was stopped for
# (JSON, until it is applied); the exploits applied to it (JSON list, oldest first: its lineage).
JUDGED_ANNOTATION = "spotray.dev/pbt-judged-step"
EXPLOIT_ANNOTATION = "spotray.dev/exploit"
LINEAGE_ANNOTATION = "spotray.dev/lineage"
MAX_LINEAGE = 32  # exploits kept in a trial's lineage annotation (the newest)
# On a trial with early stopping: the rung steps, comma-separated, at which the controller records the
# trial's objective in its status (status.intervalLosses), besides its last step.
OBJECTIVE_STEPS_ANNOTATION = "spotray.dev/objective-steps"
# Rungs are listed up to here, whatever a trial's step target (which only its entrypoint knows).
MAX_RUNG_STEP = 10**9
# At most this many steps in the annotation, and entries in status.intervalLosses: a bounded status.
MAX_OBJECTIVE_STEPS = 64
MAX_TRIALS = 999
# Room for "-t999" after the sweep's name, within a TrainingRun name's limit.
MAX_SWEEP_NAME_LENGTH = MAX_NAME_LENGTH - len(f"-t{MAX_TRIALS}")
ALGORITHMS = ("grid", "random", "tpe")
DIRECTIONS = ("minimize", "maximize")
METRICS = ("loss",)  # what every attempt's progress records carry (train/records/progress_log.py)
PARAMETER_TYPES = ("float", "int", "choice")
PARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Parameter:
    """One dimension of the search space: a range (``low``..``high``, ``log`` for a log scale) or ``values``."""

    name: str
    type: str  # float, int or choice
    low: float | None = None
    high: float | None = None
    log: bool = False
    values: tuple[Any, ...] = ()

    @property
    def enumerable(self) -> bool:
        """Whether a grid can list every value: given values, or an int range."""
        return bool(self.values) or self.type == "int"

    def grid(self) -> list[Any]:
        if self.values:
            return list(self.values)
        assert self.low is not None
        assert self.high is not None
        return list(range(int(self.low), int(self.high) + 1))


@dataclass(frozen=True)
class SweepField:
    """What the declaration of one field of a sweep's section says beyond its Python type and default."""

    description: str  # `kubectl explain trainingsweep.spec` prints it
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # an exclusive minimum
    choices: tuple[str, ...] | None = None
    when_missing: str | None = None  # a required field: what to write
    key: str | None = None  # its key in the manifest, where it is not the field's name in camelCase


def sweep_field(description: str, *, default: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A field of a sweep's section, with its ``SweepField``; no default: the field is required."""
    return dataclasses.field(default=default, metadata={"sweep": SweepField(description, **declared)})


def sweep_declarations(cls: type[Any]) -> list[tuple[str, dataclasses.Field[Any], SweepField]]:
    """(key in the manifest, dataclass field, declaration) of each field of a sweep's section."""
    found = []
    for section_field in dataclasses.fields(cls):
        declared: SweepField = section_field.metadata["sweep"]
        found.append((declared.key or camel(section_field.name), section_field, declared))
    return found


@dataclass(frozen=True)
class SearchSpec:
    """How new trials get their values (Optuna's samplers)."""

    algorithm: str = sweep_field("grid, random or tpe.", default="random", choices=ALGORITHMS)
    seed: int = sweep_field(
        "Seeds every sampler: the same sweep asks for the same values.", default=0, minimum=0, maximum=2**31 - 1
    )


@dataclass(frozen=True)
class ObjectiveSpec:
    """What a trial is judged by: the mean loss over a checkpoint interval."""

    metric: str = sweep_field("The metric (loss).", default="loss", choices=METRICS)
    direction: str = sweep_field("minimize or maximize.", default="minimize", choices=DIRECTIONS)


@dataclass(frozen=True)
class TrialsSpec:
    """How many trials in all, and how many at once."""

    max_trials: int = sweep_field("Trials in all.", default=10, minimum=1, maximum=MAX_TRIALS, key="max")
    parallel: int = sweep_field("Trials running at once.", default=1, minimum=1, maximum=MAX_TRIALS)
    max_gpu_hours: float | None = sweep_field(
        "The GPU-hours the trials may spend in all: each trial's attempts' time times its GPUs (a CPU-only "
        "worker counts as one). Once spent, no trial starts or resumes; running trials finish. Unset: no such "
        "budget.",
        default=None,
        above=0,
    )


@dataclass(frozen=True)
class EarlyStopping:
    """Asynchronous successive halving at checkpoints: rungs at minSteps * reductionFactor^k, and a trial
    goes on past a rung only among the best 1/reductionFactor there."""

    min_steps: int = sweep_field(
        "The first rung: a multiple of the template's checkpoint.everySteps.",
        minimum=1,
        maximum=MAX_RUNG_STEP,
        when_missing="the first rung, a multiple of checkpoint.everySteps",
    )
    reduction_factor: int = sweep_field("Only the best 1/factor go past a rung.", default=3, minimum=2, maximum=100)

    def rungs(self, max_steps: int) -> list[int]:
        """The rung steps below ``max_steps``: where a trial is compared with the others."""
        steps, rung = [], self.min_steps
        while rung < max_steps:
            steps.append(rung)
            rung *= self.reduction_factor
        return steps


@dataclass(frozen=True)
class PopulationBased:
    """Population-based training: every intervalSteps, a trial in the bottom quantile continues from the
    checkpoint of one in the top quantile (checkpoint.startFrom) with its values perturbed. The whole
    population trains at once (trials.parallel = trials.max)."""

    interval_steps: int = sweep_field(
        "How often trials are compared: a multiple of the template's checkpoint.everySteps.",
        minimum=1,
        maximum=MAX_RUNG_STEP,
        when_missing="how often trials are compared, a multiple of checkpoint.everySteps",
    )
    quantile: float = sweep_field(
        "The bottom fraction that exploits the top fraction.", default=0.25, above=0, maximum=0.5
    )
    resample_probability: float = sweep_field(
        "Each value is resampled with this probability, else perturbed (x0.8 or x1.2 for a range, a neighbour "
        "for listed values).",
        default=0.25,
        minimum=0,
        maximum=1,
    )

    def steps(self, max_steps: int) -> list[int]:
        """The steps below ``max_steps`` where trials are compared (at most MAX_OBJECTIVE_STEPS)."""
        last = min(max_steps - 1, self.interval_steps * MAX_OBJECTIVE_STEPS)
        return list(range(self.interval_steps, last + 1, self.interval_steps))


@dataclass(frozen=True)
class Exploit:
    """One exploit of population-based training: judged at ``step``, the trial goes on from ``donor``'s
    checkpoint at ``donor_step`` with ``values`` (the donor's, perturbed); ``before``: its own values."""

    step: int
    donor: int
    donor_step: int
    before: dict[str, Any]
    values: dict[str, Any]
    applied: str | None = None  # when the trial was resumed with it (RFC 3339): its new life begins after

    def to_json(self) -> dict[str, Any]:
        found = {
            "step": self.step,
            "donor": self.donor,
            "donorStep": self.donor_step,
            "before": self.before,
            "values": self.values,
        }
        return found | ({"applied": self.applied} if self.applied else {})

    @classmethod
    def from_json(cls, data: Any) -> Exploit | None:
        """An exploit as an annotation holds it; None when it is not one (anyone may edit annotations)."""
        try:
            applied = data.get("applied")
            exploit = cls(
                int(data["step"]),
                int(data["donor"]),
                int(data["donorStep"]),
                data["before"],
                data["values"],
                str(applied) if applied else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return exploit if isinstance(exploit.before, dict) and isinstance(exploit.values, dict) else None


def pending_exploit(annotations: dict[str, Any]) -> Exploit | None:
    """The exploit a trial was stopped for and not yet resumed with (its annotation), if readable."""
    return Exploit.from_json(_json_or_none(annotations.get(EXPLOIT_ANNOTATION)))


def trial_lineage(annotations: dict[str, Any]) -> tuple[Exploit, ...]:
    """The exploits applied to a trial, oldest first (its lineage annotation); unreadable entries left out."""
    found = _json_or_none(annotations.get(LINEAGE_ANNOTATION))
    return tuple(e for d in found if (e := Exploit.from_json(d))) if isinstance(found, list) else ()


def _json_or_none(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class SweepSpec:
    template: RunSpec
    template_document: dict[str, Any]  # the template as written, from which each trial's spec is made
    parameters: tuple[Parameter, ...]
    search: SearchSpec = SearchSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    trials: TrialsSpec = TrialsSpec()
    early_stopping: EarlyStopping | None = None
    population: PopulationBased | None = None

    def objective_steps(self, max_steps: int = MAX_RUNG_STEP) -> list[int]:
        """Where trials are compared, below ``max_steps``: ASHA's rungs, or PBT's intervals (or none)."""
        if self.early_stopping is not None:
            return self.early_stopping.rungs(max_steps)
        if self.population is not None:
            return self.population.steps(max_steps)
        return []


@dataclass(frozen=True)
class TrainingSweep:
    name: str
    spec: SweepSpec
    namespace: str = "default"

    def trial_name(self, number: int) -> str:
        return f"{self.name}-t{number}"

    def trial_checkpoint_uri(self, number: int) -> str:
        """Where trial ``number`` keeps its checkpoints: a prefix of its own under the template's."""
        return f"{self.spec.template.checkpoint.uri.rstrip('/')}/{self.trial_name(number)}"

    def donor_checkpoint(self, exploit: Exploit) -> str:
        """The checkpoint an exploiting trial starts from: its donor's, at the donor's step."""
        return f"{self.trial_checkpoint_uri(exploit.donor)}/checkpoint-{exploit.donor_step}"

    def trial_spec(self, number: int, values: dict[str, Any]) -> dict[str, Any]:
        """Trial ``number``'s TrainingRun spec: the template with ``values`` in its entrypoint."""
        spec: dict[str, Any] = json.loads(json.dumps(self.spec.template_document))  # a deep copy of plain data
        spec["entrypoint"] = fill_entrypoint(spec["entrypoint"], values)
        spec["checkpoint"]["uri"] = self.trial_checkpoint_uri(number)
        return spec

    def trial_manifest(self, number: int, values: dict[str, Any], owner_uid: str | None = None) -> dict[str, Any]:
        """Trial ``number``'s TrainingRun: the template with ``values`` in its entrypoint and a checkpoint
        prefix of its own, labelled with the sweep and the trial, its values in an annotation."""
        name = self.trial_name(number)
        spec = self.trial_spec(number, values)
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": {SWEEP_LABEL: self.name, TRIAL_LABEL: str(number)},
            "annotations": {PARAMS_ANNOTATION: json.dumps(values, sort_keys=True)},
        }
        # Every trial has it, empty without rungs: the controller records a trial's objective at its
        # last step (and at these) only in a TrainingRun that carries it.
        steps = self.spec.objective_steps()[:MAX_OBJECTIVE_STEPS]
        metadata["annotations"][OBJECTIVE_STEPS_ANNOTATION] = ",".join(map(str, steps))
        if owner_uid is not None:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": API_VERSION,
                    "kind": SWEEP_KIND,
                    "name": self.name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def objective_steps(annotations: dict[str, Any]) -> tuple[int, ...] | None:
    """The steps a trial's annotation asks the objective for, besides its last step; None when the run
    carries no such annotation (it is no sweep's trial: no objective is recorded); () for a trial
    without rungs, or one whose annotation is unreadable (its last step's objective only)."""
    if OBJECTIVE_STEPS_ANNOTATION not in annotations:
        return None
    try:
        steps = tuple(int(step) for step in str(annotations.get(OBJECTIVE_STEPS_ANNOTATION) or "").split(",") if step)
    except ValueError:
        return ()
    return tuple(step for step in steps if 0 < step <= MAX_RUNG_STEP)[:MAX_OBJECTIVE_STEPS]


def interval_mean(losses: dict[int, float], end: int, every: int) -> float | None:
    """A trial's objective at step ``end``: the mean loss over the checkpoint interval that ends there,
    which is less noisy than one step's (over the steps logged in it; None when none was)."""
    window = [loss for step, loss in losses.items() if end - every < step <= end and math.isfinite(loss)]
    return sum(window) / len(window) if window else None


def gpu_hours(workers: WorkerSpec, attempt_seconds: float) -> float:
    """What a trial spent of a sweep's ``maxGpuHours``: the time its attempts ran (from each RayJob's
    creation to its end, or to now), times its GPUs (``replicas x gpu``; a CPU-only worker counts as
    one, so a budget binds a CPU sweep too). Every worker is counted for all of it, as status.cost does."""
    return max(0.0, attempt_seconds) * workers.num_workers / 3600


def objective_values(
    losses: dict[int, float], steps: Sequence[int], complete: int | None, every: int
) -> dict[int, float]:
    """The objective at each of ``steps`` up to ``complete``, the newest complete checkpoint's step: a
    trial is judged at a step only once it can be stopped there and resumed from there without losing
    a step. ``losses`` maps each step to its loss (a local run's event log, or an attempt's progress)."""
    if complete is None:
        return {}
    found = {step: interval_mean(losses, step, every) for step in steps if step <= complete}
    return {step: value for step, value in found.items() if value is not None}


def format_value(value: Any) -> str:
    """A value as the entrypoint gets it: floats in their shortest exact form (1e-05, 0.0003)."""
    return repr(value) if isinstance(value, float) else str(value)


def fill_entrypoint(entrypoint: str, values: dict[str, Any]) -> str:
    return string.Template(entrypoint).substitute({name: format_value(value) for name, value in values.items()})


def placeholders(entrypoint: str) -> set[str]:
    """The ``${name}`` (and ``$name``) the entrypoint holds; ``$$`` is a literal ``$``."""
    found = set()
    for match in string.Template.pattern.finditer(entrypoint):
        named = match.group("named") or match.group("braced")
        if named:
            found.add(named)
    return found


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.items.append(f"{path}: must be a mapping, got {value!r}")
            return {}
        return value

    def known(self, data: dict[str, Any], path: str, keys: tuple[str, ...]) -> None:
        for key in sorted(set(data) - set(keys), key=str):
            self.items.append(unknown_field(f"{path}.{key}", key, keys))

    def choice(self, data: dict[str, Any], key: str, path: str, default: str, allowed: tuple[str, ...]) -> str:
        value = data.get(key, default)
        if value not in allowed:
            self.items.append(f"{path}.{key}: must be one of {', '.join(allowed)}, got {value!r}")
            return default
        return str(value)

    def section(self, cls: type[Any], data: Any, path: str) -> Any:
        """A sweep's section read by its declarations (``sweep_field``); None when a required field is
        missing or unreadable (every problem is noted, so the sweep is refused)."""
        data = self.mapping(data, path)
        declared = sweep_declarations(cls)
        self.known(data, path, tuple(key for key, _, _ in declared))
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        complete = True
        for key, section_field, info in declared:
            if data.get(key) is None:
                if section_field.default is dataclasses.MISSING:
                    self.items.append(f"{path}.{key}: missing; {info.when_missing}")
                    complete = False
                continue
            value = self.value(field_type(hints[section_field.name]), info, data[key], f"{path}.{key}")
            if value is not None:
                values[section_field.name] = value
            elif section_field.default is dataclasses.MISSING:
                complete = False
        return cls(**values) if complete else None

    def value(self, python_type: type, info: SweepField, value: Any, path: str) -> Any:
        """``value`` when it is what the declaration allows, else None with the problem noted."""
        if info.choices is not None:
            if value in info.choices:
                return value
            self.items.append(f"{path}: must be one of {', '.join(info.choices)}, got {value!r}")
            return None
        if python_type is int:
            fits = isinstance(value, int) and not isinstance(value, bool) and _within(value, info)
            if not fits:
                self.items.append(f"{path}: must be an integer {_bounds(info)}, got {value!r}")
            return value if fits else None
        if _number(value) and _within(value, info):
            return float(value)
        self.items.append(f"{path}: must be a number {_bounds(info)}, got {value!r}")
        return None


def _within(value: float, info: SweepField) -> bool:
    low_ok = (info.minimum is None or value >= info.minimum) and (info.above is None or value > info.above)
    return low_ok and (info.maximum is None or value <= info.maximum)


def _bounds(info: SweepField) -> str:
    """The range a declaration allows, in words: "from 2 to 100", "above 0 and at most 0.5"."""
    if info.minimum is not None and info.maximum is not None:
        return f"from {_shown(info.minimum)} to {_shown(info.maximum)}"
    words = []
    if info.minimum is not None:
        words.append(f"of at least {_shown(info.minimum)}")
    if info.above is not None:
        words.append(f"above {_shown(info.above)}")
    if info.maximum is not None:
        words.append(f"at most {_shown(info.maximum)}")
    return " and ".join(words)


def _shown(bound: float) -> str:
    """A bound as a person writes it: 2147483647 and 0.5, never 2.14748e+09."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def _fits(kind: str, value: Any) -> bool:
    """Whether ``value`` may be one of the listed values of a parameter of type ``kind``."""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return _number(value)
    return isinstance(value, str | int | float | bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _parameter(name: Any, data: Any, problems: _Problems) -> Parameter | None:
    path = f"spec.parameters.{name}"
    if not isinstance(name, str) or not PARAMETER_NAME.match(name):
        problems.items.append(f"{path}: a parameter's name must be a letter or _ then letters, digits or _")
        return None
    data = problems.mapping(data, path)
    problems.known(data, path, ("type", "low", "high", "log", "values"))
    kind = problems.choice(data, "type", path, "", PARAMETER_TYPES)
    log = data.get("log", False)
    if not isinstance(log, bool):
        problems.items.append(f"{path}.log: must be true or false, got {log!r}")
    elif "values" in data:
        if "low" in data or "high" in data:
            problems.items.append(f"{path}: give values or low and high, not both")
        return _listed(name, kind, data["values"], path, problems) if kind else None
    elif kind == "choice":
        problems.items.append(f"{path}.values: a choice lists its values, e.g. values: [adamw, sgd]")
    elif kind:
        return _ranged(name, kind, (data.get("low"), data.get("high")), path, problems, log=log)
    return None


def _listed(name: str, kind: str, values: Any, path: str, problems: _Problems) -> Parameter | None:
    if not isinstance(values, list) or not values:
        problems.items.append(f"{path}.values: must be a non-empty list, got {values!r}")
        return None
    wrong = [v for v in values if not _fits(kind, v)]
    if wrong:
        problems.items.append(f"{path}.values: every value must be a{'n' if kind == 'int' else ''} {kind}: {wrong}")
        return None
    if len(set(map(format_value, values))) != len(values):
        problems.items.append(f"{path}.values: each value once, got {values}")
    return Parameter(name, kind, values=tuple(float(v) if kind == "float" else v for v in values))


def _ranged(
    name: str, kind: str, bounds: tuple[Any, Any], path: str, problems: _Problems, *, log: bool
) -> Parameter | None:
    low, high = bounds
    if not (_number(low) and _number(high)) or low >= high:
        problems.items.append(f"{path}: low and high must be numbers with low < high, got low={low!r}, high={high!r}")
    elif kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        problems.items.append(f"{path}: an int range has whole low and high, got {low!r}..{high!r}")
    elif log and low <= 0:
        problems.items.append(f"{path}: a log scale needs low > 0, got {low!r}")
    else:
        return Parameter(name, kind, low=float(low), high=float(high), log=log)
    return None


def parse_sweep(document: Any, where: str = SWEEP_KIND) -> TrainingSweep:
    """A ``TrainingSweep`` from a whole manifest; raises ``InvalidSpecError`` listing every problem."""
    problems = _Problems()
    document = problems.mapping(document, "document")
    if document.get("apiVersion") != API_VERSION:
        problems.items.append(f"apiVersion: must be {API_VERSION}, got {document.get('apiVersion')!r}")
    if document.get("kind") != SWEEP_KIND:
        problems.items.append(f"kind: must be {SWEEP_KIND}, got {document.get('kind')!r}")
    metadata = problems.mapping(document.get("metadata"), "metadata")
    name, namespace = metadata.get("name"), str(metadata.get("namespace", "default"))
    if (problem := name_problem(name)) is not None:
        problems.items.append(problem)
    elif len(str(name)) > MAX_SWEEP_NAME_LENGTH:
        problems.items.append(
            f"metadata.name: must be at most {MAX_SWEEP_NAME_LENGTH} characters: trial N is the TrainingRun "
            f"<name>-tN, whose name has at most {MAX_NAME_LENGTH}"
        )
    spec = problems.mapping(document.get("spec"), "spec")
    problems.known(
        spec, "spec", ("template", "parameters", "search", "objective", "trials", "earlyStopping", "populationBased")
    )

    template_document = problems.mapping(spec.get("template"), "spec.template")
    template: RunSpec | None = None
    try:
        template = parse_spec(template_document, where)
    except InvalidSpecError as error:
        problems.items += [f"spec.template: {problem}" for problem in error.problems]

    raw_parameters = problems.mapping(spec.get("parameters"), "spec.parameters")
    if not raw_parameters:
        problems.items.append(
            "spec.parameters: missing; name at least one, e.g. lr: {type: float, low: 1e-5, high: 1e-2}"
        )
    parameters = tuple(p for n, d in raw_parameters.items() if (p := _parameter(n, d, problems)) is not None)

    search: SearchSpec = problems.section(SearchSpec, spec.get("search"), "spec.search") or SearchSpec()
    objective: ObjectiveSpec = (
        problems.section(ObjectiveSpec, spec.get("objective"), "spec.objective") or ObjectiveSpec()
    )
    trials: TrialsSpec = problems.section(TrialsSpec, spec.get("trials"), "spec.trials") or TrialsSpec()
    early_stopping = _early_stopping(spec.get("earlyStopping"), template, problems)
    population = _population(spec.get("populationBased"), template, problems)
    if population is not None and early_stopping is not None:
        problems.items.append("spec.populationBased: give earlyStopping or populationBased, not both")
    if population is not None and trials.parallel != trials.max_trials:
        problems.items.append(
            f"spec.trials.parallel: population-based training trains the whole population at once: make it "
            f"trials.max ({trials.max_trials}), got {trials.parallel}"
        )

    _check_use(template, raw_parameters, parameters, search.algorithm, problems)
    if problems.items:
        raise InvalidSpecError(problems.items, where)
    assert template is not None
    return TrainingSweep(
        name=str(name),
        namespace=namespace,
        spec=SweepSpec(
            template=template,
            template_document=template_document,
            parameters=parameters,
            search=search,
            objective=objective,
            trials=trials,
            early_stopping=early_stopping,
            population=population,
        ),
    )


def _check_use(
    template: RunSpec | None,
    raw_parameters: dict[str, Any],
    parameters: tuple[Parameter, ...],
    algorithm: str,
    problems: _Problems,
) -> None:
    """Every ``${name}`` of the entrypoint is a parameter and every parameter is used; a grid can list each."""
    if template is not None:
        used = placeholders(template.entrypoint)
        for unknown in sorted(used - set(raw_parameters)):
            problems.items.append(
                f"spec.template.entrypoint: ${{{unknown}}} names no parameter (known: {sorted(raw_parameters)})"
            )
        for unused in sorted({p.name for p in parameters} - used):
            problems.items.append(
                f"spec.parameters.{unused}: the entrypoint never uses it; write ${{{unused}}} where its value goes"
            )
    if algorithm == "grid":
        for parameter in parameters:
            if not parameter.enumerable:
                problems.items.append(
                    f"spec.parameters.{parameter.name}: a grid lists every value: give values: [...] for a float"
                )


def _early_stopping(data: Any, template: RunSpec | None, problems: _Problems) -> EarlyStopping | None:
    if data is None:
        return None
    path = "spec.earlyStopping"
    early_stopping: EarlyStopping | None = problems.section(EarlyStopping, data, path)
    if early_stopping is not None:
        why = "a trial stopped at a rung resumes from the checkpoint there"
        _checkpoint_multiple(early_stopping.min_steps, template, f"{path}.minSteps", problems, why)
    return early_stopping


def _checkpoint_multiple(value: int, template: RunSpec | None, path: str, problems: _Problems, why: str) -> None:
    """``value`` steps fall on checkpoints: a multiple of a fixed checkpoint.everySteps."""
    every = template.checkpoint.fixed_every_steps if template is not None else None
    if template is not None and every is None:
        problems.items.append(f"{path}: {why}, and checkpoint.everySteps is auto; give it a number of steps")
    elif every and value % every:
        problems.items.append(f"{path}: must be a multiple of checkpoint.everySteps ({every}), got {value}: {why}")


def _population(data: Any, template: RunSpec | None, problems: _Problems) -> PopulationBased | None:
    if data is None:
        return None
    path = "spec.populationBased"
    population: PopulationBased | None = problems.section(PopulationBased, data, path)
    if population is not None:
        why = "a trial exploits a checkpoint there"
        _checkpoint_multiple(population.interval_steps, template, f"{path}.intervalSteps", problems, why)
    if template is not None and template.checkpoint.start_from is not None:
        problems.items.append(
            "spec.template.checkpoint.startFrom: population-based training sets it on each trial that exploits "
            "another; remove it from the template"
        )
    return population
