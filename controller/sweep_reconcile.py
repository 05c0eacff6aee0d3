"""One reconcile of one TrainingSweep: read its trials, decide (spotray/decisions/sweep_plan.py), act, write its status.

A sweep keeps nothing of its own but its status, which is only a report: its trials are the state.
Each trial is a TrainingRun ``<sweep>-tN`` that this sweep owns (an owner reference with its UID);
its values are in an annotation, whether the sweep stopped it in another, and its objective at each
rung in its own status (status.intervalLosses, which the TrainingRun reconcile records from the
trial's progress in S3). So the sweep reads TrainingRun objects only, never S3 and never a Secret,
and a controller killed mid-sweep finds everything it needs on restart: the decision is rebuilt
from the trials every time, and a new trial's values come from a sampler seeded by its number.

The order of the writes makes a restart at any point safe:
- a new trial is created under its deterministic name; a create that answers 409 with a trial of
  this sweep is the same trial (the controller died after creating it), and the decision is not
  made again for it; a TrainingRun of that name that is not this sweep's is reported, never taken;
- a stopped trial gets its rung recorded and ``spec.suspend: true`` in one merge patch, so a
  suspended trial without the record is one someone else suspended (``held``: never resumed by the
  sweep);
- the sweep's status is written last, and is only a report.

The TrainingRun reconcile does the rest: a suspended trial stops on a checkpoint, a resumed one
starts a new attempt from its newest complete checkpoint, preemptions count against the trial's own
budget, never as a failure.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from spotray.contract.extras import MissingExtraError
from spotray.contract.names import FAILED, SWEEP_LABEL
from spotray.contract.spec import InvalidSpecError
from spotray.contract.sweep import TrainingSweep, parse_sweep
from spotray.contract.sweep_status import SweepStatus, TrialCounts
from spotray.controller.kube import Cluster
from spotray.controller.reconcile import status_changed
from spotray.decisions.sweep_trials import trial_facts

log = logging.getLogger(__name__)
# A sweep's trials tell it when they change (their watch events), so this is only a safety net.
REFRESH_S = 60.0


def owned_by(run: dict[str, Any], uid: str) -> bool:
    """Whether ``run`` is a trial of the sweep whose UID is ``uid`` (its controller owner reference)."""
    references = (run.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in references)


def reconcile_sweep(cluster: Cluster, namespace: str, name: str) -> float | None:
    """Bring one TrainingSweep one step closer to done; returns seconds until it wants another look."""
    body = cluster.get_sweep(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None  # its trials go with it: they are owned, and the garbage collector deletes them
    stored = body.get("status") or {}
    generation = body["metadata"].get("generation", 0)
    try:
        sweep = parse_sweep(body, where=f"TrainingSweep {namespace}/{name}")
        from spotray.decisions import sweep_plan as decisions  # noqa: PLC0415 - needs the [sweep] extra (Optuna)
    except (InvalidSpecError, MissingExtraError) as error:
        message = str(error)
        refused = SweepStatus(phase=FAILED, message=message, observed_generation=generation).to_status()
        if status_changed(stored, refused):
            cluster.patch_sweep_status(namespace, name, refused)
        log.warning("TrainingSweep %s/%s refused: %s", namespace, name, message)
        return None
    uid = str(body["metadata"]["uid"])
    runs = cluster.list_labelled_runs(namespace, {SWEEP_LABEL: name})
    facts = [fact for run in runs if owned_by(run, uid) and (fact := trial_facts(sweep.spec, run))]
    plan = decisions.decide(sweep.spec, facts)
    problems: list[str] = []
    for number, values in plan.start:
        if problem := _create_trial(cluster, sweep, uid, number, values):
            problems.append(problem)
    for number, patch in decisions.trial_patches(sweep, plan, facts).items():
        try:
            cluster.patch_run(namespace, sweep.trial_name(number), patch)
        except ApiException as error:
            if error.status != 404:
                raise
            problems.append(f"trial {sweep.trial_name(number)} was deleted; the sweep goes on without it")
        log.info("TrainingSweep %s/%s: trial %d: %s", namespace, name, number, patch)
    status = decisions.sweep_status(sweep.spec, facts, plan)
    message = "; ".join(problems) or _summary(sweep, status, plan.budget_spent)
    written = dataclasses.replace(status, observed_generation=generation, message=message).to_status()
    if status_changed(stored, written):
        cluster.patch_sweep_status(namespace, name, written)
    return None if plan.finished else REFRESH_S


def _create_trial(cluster: Cluster, sweep: TrainingSweep, uid: str, number: int, values: dict[str, Any]) -> str:
    """Create trial ``number``; "" when it is there (created now, or before a restart), else the problem."""
    existing = cluster.create_run(sweep.trial_manifest(number, values, owner_uid=uid))
    if existing is None:
        log.info("TrainingSweep %s/%s: started trial %d with %s", sweep.namespace, sweep.name, number, values)
        return ""
    if owned_by(existing, uid):
        return ""
    return (
        f"TrainingRun {sweep.trial_name(number)} exists and is not this sweep's trial: rename or delete it, "
        "and the sweep starts its trial there"
    )


def _summary(sweep: TrainingSweep, status: SweepStatus, budget_spent: bool) -> str:
    trials = (status.trials or TrialCounts()).to_status()
    counts = ", ".join(f"{count} {state}" for state, count in trials.items() if count)
    best = status.best
    found = f"; best so far trial {best.trial} ({sweep.spec.objective.metric} {best.loss})" if best else ""
    budget = sweep.spec.trials.max_gpu_hours
    spent = "" if budget is None else f"; {status.gpu_hours} of {budget:g} GPU-hours spent"
    if budget_spent:
        spent += ": no trial starts or resumes"
    return f"{status.started} of {status.limit} trials started ({counts or 'none yet'}){found}{spent}"
