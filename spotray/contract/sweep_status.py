"""The TrainingSweep's status as typed data (``SweepStatus``), declared once: the controller writes it
(spotray/decisions/sweep_plan.py ``sweep_status``), the CRD's status schema comes from it
(controller/crd.py). Only a report: a sweep's trials are its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotray.contract.status import StatusObject, status_field

# The sweep's phases (status.phase).
SWEEP_PHASES = ("Running", "Succeeded", "Failed")
MAX_STATUS_LINEAGE = 64  # exploits listed in a sweep's status.lineage (the newest)


@dataclass(frozen=True)
class TrialCounts(StatusObject):
    """status.trials: the sweep's trials by state."""

    running: int | None = status_field("Trials running.", minimum=0)
    suspended: int | None = status_field("Trials suspended: stopped at a rung, or waiting to exploit.", minimum=0)
    succeeded: int | None = status_field("Trials succeeded.", minimum=0)
    failed: int | None = status_field("Trials failed.", minimum=0)


@dataclass(frozen=True)
class BestTrial(StatusObject):
    """status.best: the trial that succeeded with the best objective."""

    trial: int | None = status_field("Its number.", minimum=0)
    loss: float | None = status_field("Its objective: the mean loss over its last checkpoint interval.")


@dataclass(frozen=True)
class LineageEntry(StatusObject):
    """One exploit applied: the trial, the step it was judged at, the donor and the donor's step, its new values."""

    trial: int | None = status_field("The trial that exploited.", minimum=0)
    step: int | None = status_field("The step it was judged at.", minimum=0)
    donor: int | None = status_field("The trial whose checkpoint it went on from.", minimum=0)
    donor_step: int | None = status_field("The donor's step it went on from.", minimum=0)
    values: dict[str, Any] | None = status_field("Its new values.")


@dataclass(frozen=True)
class SweepStatus(StatusObject):
    """Written by the controller: a report; the trials are the state."""

    phase: str | None = status_field(
        "Running, Succeeded (no trial left to run, one succeeded) or Failed.", enum=list(SWEEP_PHASES)
    )
    message: str | None = status_field("The sweep in one line, or what stops it, with the fix.")
    observed_generation: int | None = status_field(
        "The sweep's metadata.generation this status was made from.", format="int64", minimum=0
    )
    started: int | None = status_field("Trials started so far.", minimum=0)
    limit: int | None = status_field(
        "Trials the sweep may start in all (spec.trials.max, or the grid's size).", minimum=0
    )
    trials: TrialCounts | None = status_field("Trials by state.")
    best: BestTrial | None = status_field("The trial that succeeded with the best objective.")
    gpu_hours: float | None = status_field(
        "GPU-hours the trials spent so far (see spec.trials.maxGpuHours).", minimum=0
    )
    exploits: int | None = status_field(
        "Population-based training: the exploits done so far (each trial's lineage is in its "
        "spotray.dev/lineage annotation).",
        minimum=0,
    )
    lineage: tuple[LineageEntry, ...] | None = status_field(
        f"Population-based training: each exploit applied, oldest first (the newest {MAX_STATUS_LINEAGE}).",
        items="One exploit.",
        maxItems=MAX_STATUS_LINEAGE,
    )
