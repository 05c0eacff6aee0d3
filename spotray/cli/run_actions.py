"""``spotray validate``, ``delete``, ``suspend`` and ``resume``: what kubectl users do to a run, said in
spotray's words.

``validate`` reads manifests only (no cluster): every problem of every file at once, the same
checks ``run`` and ``submit`` make before they send anything. ``delete`` removes a TrainingRun (or
a TrainingSweep) and says that its checkpoints stay in the store, so the same manifest applied
again resumes. ``suspend`` and ``resume`` set ``spec.suspend``: the controller stops the current
attempt after a checkpoint, and starts the next one from it on resume.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from spotray.cli.exit_codes import NotFoundError
from spotray.cli.output import emit
from spotray.contract.attempts import EXIT_BAD_INPUT, EXIT_OK
from spotray.contract.errors import SpotrayError
from spotray.contract.names import GROUP, KIND, SWEEP_KIND
from spotray.contract.spec import parse_training_run, read_manifest
from spotray.contract.sweep import parse_sweep

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection


def validate_command(files: list[Path]) -> int:
    """Each file checked; problems go to stderr, a verdict per file to stdout; exit 2 if any is bad."""
    bad = 0
    for path in files:
        try:
            document = read_manifest(path)
            if isinstance(document, dict) and document.get("kind") == SWEEP_KIND:
                kind, name = SWEEP_KIND, parse_sweep(document, where=str(path)).name
            else:
                kind, name = KIND, parse_training_run(document, where=str(path)).name
        except SpotrayError as error:
            bad += 1
            print(f"error: {error}", file=sys.stderr)
            continue
        emit(f"{path}: a valid {kind} {name!r}")
    return EXIT_BAD_INPUT if bad else EXIT_OK


def _kind_of(cluster: ClusterConnection, name: str) -> str:
    """``name``'s kind: a TrainingRun, else a TrainingSweep; the TrainingRun's not-found error if neither."""
    try:
        cluster.get_run(name)
    except NotFoundError as no_run:
        try:
            cluster.get_run(name, kind=SWEEP_KIND)
        except NotFoundError:
            raise no_run from None
        return SWEEP_KIND
    return KIND


def delete_command(cluster: ClusterConnection, name: str) -> int:
    kind = _kind_of(cluster, name)
    cluster.delete_run(name, kind=kind)
    emit(f"{kind.lower()}.{GROUP}/{name} deleted (namespace {cluster.namespace}, context {cluster.context_name})")
    what = "its checkpoints stay" if kind == KIND else "its trials are deleted with it; their checkpoints stay"
    emit(f"  {what} in the store: apply the same manifest again and it resumes from the newest")
    return EXIT_OK


def suspend_command(cluster: ClusterConnection, name: str, suspended: bool) -> int:
    if _kind_of(cluster, name) != KIND:
        raise SpotrayError(
            f"{name} is a TrainingSweep; suspend and resume act on one TrainingRun",
            f"suspend its trials one by one (`spotray status {name}` lists them)",
        )
    changed = cluster.set_suspended(name, suspended)
    verb = "suspended" if suspended else "resumed"
    if not changed:
        emit(f"trainingrun.{GROUP}/{name} unchanged (already {verb})")
        return EXIT_OK
    emit(f"trainingrun.{GROUP}/{name} {verb} (namespace {cluster.namespace}, context {cluster.context_name})")
    if suspended:
        emit("  the current attempt stops after a checkpoint; `spotray resume` starts the next one from it")
    else:
        emit(f"  the next attempt resumes from the newest checkpoint: spotray watch {name} -n {cluster.namespace}")
    return EXIT_OK
