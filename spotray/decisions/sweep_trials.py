"""A TrainingSweep's trials as facts: each trial's TrainingRun read into ``TrialFacts`` (its values,
state, objective at its rungs, lineage, the GPU-hours it spent), with no sampler: the Hydra launcher
and local mode read trials with it without Optuna. What to do with them is sweep.py's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spotray.contract.names import FAILED as FAILED_PHASE
from spotray.contract.names import SUCCEEDED as SUCCEEDED_PHASE
from spotray.contract.names import SUSPENDED as SUSPENDED_PHASE
from spotray.contract.status import AttemptStatus, RunStatus, parse_date_time
from spotray.contract.sweep import (
    JUDGED_ANNOTATION,
    MAX_RUNG_STEP,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
    TRIAL_LABEL,
    Exploit,
    SweepSpec,
    gpu_hours,
    pending_exploit,
    trial_lineage,
)

# A trial's state in the sweep (its TrainingRun's phase, read as the sweep sees it).
RUNNING, SUSPENDED, SUCCEEDED, FAILED = "Running", "Suspended", "Succeeded", "Failed"


@dataclass(frozen=True)
class TrialFacts:
    """What is known of one trial: its values, its state, and its objective at each rung it reached.

    ``rung_values`` maps a rung's step to the objective there (the mean loss over the checkpoint
    interval that ends at it), for the rungs whose checkpoint is complete; ``value`` is the objective
    at the trial's end, once it Succeeded.
    """

    number: int
    values: dict[str, Any]
    state: str  # RUNNING (pending or training), SUSPENDED, SUCCEEDED or FAILED
    rung_values: dict[int, float] = field(default_factory=dict)
    value: float | None = None
    promoted_rung: int | None = None  # the highest rung step it was let past (None: none yet)
    held: bool = False  # suspended by someone else than the sweep: never resumed by it, takes no slot
    gpu_hours: float = 0.0  # what it spent of the sweep's budget (spotray/contract/sweep.py gpu_hours)
    # Population-based training: the last step it was judged at; the exploit it was stopped for, until it is
    # applied; the exploits applied to it, oldest first.
    judged_step: int | None = None
    exploit: Exploit | None = None
    lineage: tuple[Exploit, ...] = ()


def spent_gpu_hours(trials: Sequence[TrialFacts]) -> float:
    return sum(t.gpu_hours for t in trials)


def trial_facts(spec: SweepSpec, run: dict[str, Any], now: datetime | None = None) -> TrialFacts | None:
    """A trial's facts from its TrainingRun object alone: labels, annotations, spec.suspend, and in its
    status the phase, the step target, the objective at each rung (status.intervalLosses, which the
    controller records from the trial's progress once each rung is in a complete checkpoint) and its
    attempts' times (the GPU-hours it spent, an attempt still running counted to ``now``).
    None when the object is no trial (its number or values unreadable): it is not the sweep's to judge."""
    metadata = run.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    try:
        number = int((metadata.get("labels") or {})[TRIAL_LABEL])
        values = json.loads(annotations[PARAMS_ANNOTATION])
    except (KeyError, ValueError, TypeError):
        return None
    if not isinstance(values, dict):
        return None
    status = RunStatus.of(run)
    recorded = {
        entry.step: entry.loss
        for entry in status.interval_losses or ()
        if entry.step is not None and entry.loss is not None and math.isfinite(entry.loss)
    }
    target = status.progress.total_steps if status.progress is not None else None
    reached = {step: recorded[step] for step in spec.objective_steps(target or MAX_RUNG_STEP) if step in recorded}
    lineage = trial_lineage(annotations)
    if lineage and not _new_life_reported(lineage[-1], status.attempts or ()):
        # Resumed from the donor's step, its values past it are from the life the exploit ended: until its
        # new attempt reports where it resumed (and the run's reconcile drops them), they do not count.
        reached = {step: value for step, value in reached.items() if step <= lineage[-1].donor_step}
    promoted = _int_or_none(annotations.get(PROMOTED_ANNOTATION))
    spent = gpu_hours(spec.template.workers, attempt_seconds(status.attempts or (), now or datetime.now(UTC)))
    exploit = pending_exploit(annotations)
    known = TrialFacts(
        number,
        values,
        RUNNING,
        reached,
        promoted_rung=promoted,
        gpu_hours=spent,
        judged_step=_int_or_none(annotations.get(JUDGED_ANNOTATION)),
        exploit=exploit,
        lineage=lineage,
    )
    state = _trial_state(run, status.phase, exploit)
    if state == SUCCEEDED:
        last = target if target in recorded else max(recorded, default=None)
        return dataclasses.replace(known, state=state, value=None if last is None else recorded[last], exploit=None)
    if state == FAILED:
        return dataclasses.replace(known, state=state, exploit=None)
    # Suspended by someone else than the sweep (neither at a rung nor for an exploit): never resumed by it.
    held = state == SUSPENDED and STOPPED_ANNOTATION not in annotations and exploit is None
    return dataclasses.replace(known, state=state, held=held)


def _trial_state(run: dict[str, Any], phase: str | None, exploit: Exploit | None) -> str:
    if phase == SUCCEEDED_PHASE:
        return SUCCEEDED
    if phase == FAILED_PHASE:
        return FAILED
    if not (run.get("spec") or {}).get("suspend"):
        return RUNNING
    # Stopping for its exploit: the copy happens at the start of its next attempt, so it is resumed only
    # once this one ended (resumed sooner, this attempt could simply go on).
    return RUNNING if exploit is not None and phase != SUSPENDED_PHASE else SUSPENDED


def _new_life_reported(exploit: Exploit, attempts: Sequence[AttemptStatus]) -> bool:
    """Whether an attempt begun after ``exploit`` was applied has reported the step it resumed from."""
    if exploit.applied is None:
        return True  # (an exploit recorded without its time: nothing to tell the lives apart by)
    try:
        applied = parse_date_time(exploit.applied)
    except ValueError:
        return True
    return any(
        a.start_time is not None and a.resumed_from is not None and parse_date_time(a.start_time) >= applied
        for a in attempts
    )


def attempt_seconds(attempts: Sequence[AttemptStatus], now: datetime) -> float:
    """How long a trial's attempts ran: each from its RayJob's creation to its end, or to ``now``."""
    total = 0.0
    for attempt in attempts:
        if attempt.start_time is None:
            continue
        end = parse_date_time(attempt.end_time) if attempt.end_time else now
        total += max(0.0, (end - parse_date_time(attempt.start_time)).total_seconds())
    return total


def _int_or_none(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
