"""``spotray plot RUN``: loss vs step across every attempt, each resume marked, from the progress
objects the attempts keep next to the checkpoints (``_spotray/attempt-N.progress.json``).

``spotray plot SWEEP`` (a TrainingSweep's name): every trial's curve, read the same way from its own
checkpoint prefix, with where the sweep stopped it at a rung and where it let it past one marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotray.cli.exit_codes import NotFoundError
from spotray.cli.output import emit
from spotray.cli.run_status import sweep_and_trials
from spotray.cli.target import RunLocation, open_run_store
from spotray.contract.attempts import EXIT_OK
from spotray.contract.sweep import PROMOTED_ANNOTATION, STOPPED_ANNOTATION, TRIAL_LABEL, trial_lineage
from spotray.train.records.goodput import attempts_from_progress
from spotray.train.records.plot import plot_loss_across_attempts, plot_sweep
from spotray.train.records.progress_log import read_run_progress

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection


def plot_command(location: RunLocation, png: Path | None) -> int:
    store = open_run_store(location)
    attempts = attempts_from_progress(read_run_progress(store))
    if not attempts:
        raise NotFoundError(
            f"no training progress under {store.uri.join('_spotray')}",
            "rank 0 writes it every few seconds once training has started; check RUN, or wait and try again",
        )
    png = png or Path(f"{location.name}-loss.png")
    plot_loss_across_attempts(attempts, png, f"{location.name}: training loss across attempts")
    first, last = attempts[0].points[0][0], attempts[-1].last_step
    resumes = [f"attempt {a.attempt} from step {a.resumed_from}" for a in attempts if a.resumed_from]
    emit(f"wrote {png}: {len(attempts)} attempt(s), steps {first}-{last}")
    if resumes:
        emit(f"resumed: {', '.join(resumes)}")
    return EXIT_OK


def decision_marks(label: str, annotations: dict[str, Any]) -> list[tuple[str, int, str]]:
    """Where the sweep stopped a trial at a rung, the highest rung it let it past, and where it exploited
    another trial (population-based training), from its annotations.
    A trial stopped and promoted later shows its promotion only: the stop's annotation goes as it resumes."""
    marks = []
    for annotation, what in ((STOPPED_ANNOTATION, "stopped"), (PROMOTED_ANNOTATION, "promoted")):
        try:
            marks.append((label, int(annotations[annotation]), what))
        except (KeyError, TypeError, ValueError):
            continue
    # Population-based training: each exploit, where the trial was judged (its lineage).
    return marks + [(label, exploit.step, "exploited") for exploit in trial_lineage(annotations)]


def plot_sweep_command(cluster: ClusterConnection, name: str, png: Path | None, no_run: NotFoundError) -> int:
    """NAME is no TrainingRun: plot the TrainingSweep of that name, or raise ``no_run``."""
    _, trials = sweep_and_trials(cluster, name, no_run)
    curves: dict[str, list[tuple[int, float]]] = {}
    marks: list[tuple[str, int, str]] = []
    for trial in trials:
        metadata = trial["metadata"]
        label = f"t{(metadata.get('labels') or {}).get(TRIAL_LABEL, metadata['name'])}"
        uri = str(((trial.get("spec") or {}).get("checkpoint") or {}).get("uri", ""))
        store = open_run_store(RunLocation(metadata["name"], uri, f"trial {metadata['name']}"))
        losses: dict[int, float] = {}
        for lifetime in attempts_from_progress(read_run_progress(store)):
            losses.update({step: loss for step, loss, _ in lifetime.points})  # a redone step: its latest loss
        curves[label] = sorted(losses.items())
        marks += decision_marks(label, metadata.get("annotations") or {})
    png = png or Path(f"{name}-sweep.png")
    plot_sweep(curves, marks, png, f"sweep {name}: training loss of every trial")
    drawn = sum(1 for points in curves.values() if points)
    emit(f"wrote {png}: {drawn} of {len(trials)} trial(s) with progress, {len(marks)} decision(s) marked")
    return EXIT_OK
