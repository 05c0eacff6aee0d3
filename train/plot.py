"""Loss across attempts: one PNG that shows where a run was killed, what was lost, and the resume.

The attempts come from a local run's event log (``split_attempts``) or from the progress objects
every attempt keeps next to the checkpoints (``attempts_from_progress``, for ``spotray plot``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotray.train.extras import extra_required
from spotray.train.progress_log import AttemptProgress

with extra_required("plot"):
    import matplotlib as mpl

    mpl.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt  # the backend is chosen before pyplot is imported


@dataclass
class Attempt:
    """One process lifetime of a run, as told by its event log."""

    number: int
    resumed_from: int | None
    losses: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def last_step(self) -> int:
        return self.losses[-1][0] if self.losses else (self.resumed_from or 0)


def split_attempts(events: Iterable[dict[str, Any]]) -> list[Attempt]:
    """Group events into attempts; each ``start`` event opens a new one."""
    attempts: list[Attempt] = []
    for event in events:
        kind = event.get("event")
        if kind == "start":
            attempts.append(Attempt(len(attempts) + 1, event.get("resumed_from")))
        elif not attempts:
            continue
        elif kind == "step":
            attempts[-1].losses.append((int(event["step"]), float(event["loss"])))
        elif kind == "checkpoint_complete":
            attempts[-1].checkpoints.append(int(event["step"]))
        elif kind == "end":
            attempts[-1].finished = True
    return attempts


def attempts_from_progress(progress: Iterable[AttemptProgress]) -> list[Attempt]:
    """Attempts as the run's progress objects tell them; only the newest may still be going (or done)."""
    attempts = [
        Attempt(p.attempt, p.resumed_from, [(step, loss) for step, loss, _ in p.points]) for p in progress if p.points
    ]
    if attempts:
        attempts[-1].finished = True  # nothing came after it, so nothing shows it was cut short
    return attempts


def plot_loss_across_attempts(attempts: list[Attempt], png_path: Path, title: str) -> Path:
    """Draw each attempt's loss, mark kills and resumes, shade the steps that had to be redone."""
    figure, axes = plt.subplots(figsize=(10, 5), dpi=110)
    colors = plt.get_cmap("tab10")
    redone_labelled = False
    for index, attempt in enumerate(attempts):
        if not attempt.losses:
            continue
        steps, losses = zip(*attempt.losses, strict=True)
        label = f"attempt {attempt.number}" + (
            f" (resumed from step {attempt.resumed_from})" if attempt.resumed_from else " (fresh start)"
        )
        axes.plot(steps, losses, color=colors(index), linewidth=1.2, label=label)
        if attempt.resumed_from:
            axes.axvline(attempt.resumed_from, color=colors(index), linestyle=":", linewidth=1)
            axes.text(
                attempt.resumed_from,
                0.97,
                f" attempt {attempt.number} resumed from step {attempt.resumed_from}",
                transform=axes.get_xaxis_transform(),
                rotation=90,
                verticalalignment="top",
                color=colors(index),
                fontsize=9,
            )
        if not attempt.finished:
            axes.axvline(attempt.last_step, color="red", linestyle="--", linewidth=1)
            axes.text(
                attempt.last_step,
                0.03,
                f" killed at step {attempt.last_step}",
                transform=axes.get_xaxis_transform(),  # x in data, y in axes fraction
                rotation=90,
                verticalalignment="bottom",
                color="red",
                fontsize=9,
            )
        nxt = attempts[index + 1] if index + 1 < len(attempts) else None
        if nxt is not None and nxt.resumed_from is not None and not attempt.finished:
            # One legend entry for all the shaded spans ("_" labels stay out of the legend).
            label = "_redone" if redone_labelled else "steps redone after resume"
            axes.axvspan(nxt.resumed_from, attempt.last_step, color="red", alpha=0.12, label=label)
            redone_labelled = True
        for step in attempt.checkpoints:
            axes.plot(step, dict(attempt.losses).get(step, losses[-1]), marker="o", color=colors(index), markersize=3)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path)
    plt.close(figure)
    return png_path
