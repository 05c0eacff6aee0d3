"""A small TrainingRun and one step of its plan, for the tests of its decisions.

Every plan made here is checked against the run's declared state machine
(spotray/decisions/run_plan.py ``RUN_TRANSITIONS``): a phase change it does not declare fails the test.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spotray.contract.attempts import AttemptRecords
from spotray.contract.spec import TrainingRun, parse_training_run
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.run_plan import plan, transition
from spotray.decisions.run_state import Plan, RunState

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def run(**spec_overrides: object) -> TrainingRun:
    """Run ``r``: 2 preemptions and 1 failure allowed, a 10 s backoff; ``spec_overrides`` replace sections."""
    spec: dict[str, object] = {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bkt/runs/r"}}
    spec["retry"] = {"maxPreemptions": 2, "maxFailures": 1, "backoffSeconds": 10}
    spec.update(spec_overrides)
    return parse_training_run(
        {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"}, "spec": spec}
    )


def planned(obs: Observation, now: datetime) -> Plan:
    """``plan``, its phase change checked against ``RUN_TRANSITIONS``."""
    decided = plan(obs, now)
    before, after = obs.state.phase, decided.state.phase
    assert before == after or transition(before, after) is not None, (
        f"the plan went from {before} to {after}, which RUN_TRANSITIONS does not declare: {decided.state.message}"
    )
    return decided


def step(
    state: RunState, job: RayJobView | None, records: AttemptRecords | None = None, now: datetime = NOW, **spec: object
) -> Plan:
    """One decision of the lifecycle on ``run(**spec)``, as the reconcile makes it."""
    return planned(Observation(run(**spec), state, job, records or AttemptRecords(), settle_seconds=5), now)


class LeftoverFacts:
    """What a fake API server holds of the attempts' pods and nodes, for controller/reconcile.py's
    ``_node_loss_read_back``: by default no pod is left, no Scheduled Event, no Node."""

    pods: tuple[dict[str, Any], ...] = ()
    scheduled: tuple[dict[str, Any], ...] = ()
    nodes: tuple[tuple[str, datetime], ...] = ()  # (name, created)

    def list_attempt_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return list(self.pods)

    def list_scheduled_events(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.scheduled)

    def node_created(self, name: str) -> datetime | None:
        return dict(self.nodes).get(name)
