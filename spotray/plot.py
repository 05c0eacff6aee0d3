"""``spotray plot RUN``: loss vs step across every attempt, each resume marked, from the progress
objects the attempts keep next to the checkpoints (``_spotray/attempt-N.progress.json``)."""

from __future__ import annotations

from pathlib import Path

from spotray.contract.attempts import EXIT_OK
from spotray.errors import NotFoundError
from spotray.output import emit
from spotray.target import RunLocation, open_run_store
from spotray.train.records.goodput import attempts_from_progress
from spotray.train.records.plot import plot_loss_across_attempts
from spotray.train.records.progress_log import read_run_progress


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
