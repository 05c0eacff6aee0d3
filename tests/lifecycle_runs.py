"""A small TrainingRun and one step of the controller's lifecycle, for the tests of its decisions."""

from __future__ import annotations

from datetime import UTC, datetime

from spotray.contract.attempts import AttemptRecords
from spotray.contract.spec import TrainingRun, parse_training_run
from spotray.controller.lifecycle import Observation, Plan, RayJobView, RunState, plan

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def run(**spec_overrides: object) -> TrainingRun:
    """Run ``r``: 2 preemptions and 1 failure allowed, a 10 s backoff; ``spec_overrides`` replace sections."""
    spec: dict[str, object] = {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bkt/runs/r"}}
    spec["retry"] = {"maxPreemptions": 2, "maxFailures": 1, "backoffSeconds": 10}
    spec.update(spec_overrides)
    return parse_training_run(
        {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"}, "spec": spec}
    )


def step(
    state: RunState, job: RayJobView | None, records: AttemptRecords | None = None, now: datetime = NOW, **spec: object
) -> Plan:
    """One decision of the lifecycle on ``run(**spec)``, as the reconcile makes it."""
    return plan(Observation(run(**spec), state, job, records or AttemptRecords(), settle_seconds=5), now)
