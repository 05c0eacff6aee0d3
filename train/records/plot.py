"""Loss across attempts: one PNG that shows each attempt, each worker restart inside one, each spot
notice and loss, and the steps redone after each resume.

The lifetimes come from a local run's event log (train/records/goodput.py ``split_lifetimes``) or from the
progress objects every attempt keeps next to the checkpoints (``attempts_from_progress``, for
``spotray plot``).
"""

from __future__ import annotations

from pathlib import Path

from spotray.contract.extras import extra_required
from spotray.train.records.goodput import Lifetime

with extra_required("plot"):
    import matplotlib as mpl

    mpl.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt  # the backend is chosen before pyplot is imported


def _end_mark(lifetime: Lifetime, nxt: Lifetime | None) -> tuple[str, str] | None:
    """(words, color) for where a lifetime stopped, or None when it finished the run."""
    if lifetime.notice_step is not None:
        return f" spot notice at step {lifetime.notice_step}: checkpoint", "darkorange"
    if lifetime.finished:
        return None
    if nxt is not None and nxt.restart:
        return f" a worker lost at step {lifetime.last_step}", "red"
    return f" attempt {lifetime.attempt} lost at step {lifetime.last_step}", "red"


def plot_loss_across_attempts(lifetimes: list[Lifetime], png_path: Path, title: str) -> Path:
    """Draw each attempt's loss (one color per attempt), mark worker restarts, spot notices and
    losses where they happened, and shade the steps that had to be redone. The legend sits outside
    the axes, so no mark is drawn under it."""
    figure, axes = plt.subplots(figsize=(12, 5), dpi=110)
    colors = plt.get_cmap("tab10")
    redone_labelled = False
    labelled: set[int] = set()
    for index, lifetime in enumerate(lifetimes):
        if not lifetime.points:
            continue
        color = colors((lifetime.attempt - 1) % 10)
        steps = [step for step, _, _ in lifetime.points]
        losses = [loss for _, loss, _ in lifetime.points]
        label = "_same attempt"  # "_" labels stay out of the legend
        if lifetime.attempt not in labelled:
            labelled.add(lifetime.attempt)
            start = f"resumed from step {lifetime.resumed_from}" if lifetime.resumed_from else "fresh start"
            label = f"attempt {lifetime.attempt} ({start})"
        axes.plot(steps, losses, color=color, linewidth=1.2, label=label)
        if lifetime.resumed_from:
            what = "workers restarted" if lifetime.restart else f"attempt {lifetime.attempt} resumed"
            axes.axvline(lifetime.resumed_from, color=color, linestyle=":", linewidth=1)
            axes.text(
                lifetime.resumed_from,
                0.97,
                f" {what} from step {lifetime.resumed_from}",
                transform=axes.get_xaxis_transform(),  # x in data, y in axes fraction
                rotation=90,
                verticalalignment="top",
                horizontalalignment="left",  # right of its line; a stop at the same step is on the left
                color=color,
                fontsize=8,  # a resume (from the top) and a stop (from the bottom) never meet
            )
        nxt = lifetimes[index + 1] if index + 1 < len(lifetimes) else None
        mark = _end_mark(lifetime, nxt)
        if mark is not None:
            words, mark_color = mark
            at = lifetime.notice_step if lifetime.notice_step is not None else lifetime.last_step
            axes.axvline(at, color=mark_color, linestyle="--", linewidth=1)
            axes.text(
                at,
                0.03,
                words,
                transform=axes.get_xaxis_transform(),
                rotation=90,
                verticalalignment="bottom",
                horizontalalignment="right",
                color=mark_color,
                fontsize=8,  # a resume (from the top) and a stop (from the bottom) never meet
            )
        if nxt is not None and nxt.resumed_from is not None and lifetime.last_step > nxt.resumed_from:
            label = "_redone" if redone_labelled else "steps redone after a resume"
            axes.axvspan(nxt.resumed_from, lifetime.last_step, color="red", alpha=0.12, label=label)
            redone_labelled = True
        loss_at = {step: loss for step, loss, _ in lifetime.points}
        for step in lifetime.checkpoints:
            axes.plot(step, loss_at.get(step, losses[-1]), marker="o", color=color, markersize=3)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    figure.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path)
    plt.close(figure)
    return png_path


# A sweep's decisions as the plot marks them: (marker, legend).
SWEEP_MARKS = {
    "stopped": ("x", "stopped at a rung (suspended)"),
    "promoted": ("^", "promoted: resumed"),
    "exploited": ("*", "exploited: went on from a better trial's checkpoint"),
}


def plot_sweep(
    curves: dict[str, list[tuple[int, float]]],
    marks: list[tuple[str, int, str]],
    png_path: Path,
    title: str,
) -> Path:
    """One loss curve per trial of a sweep (``curves``: label -> (step, loss) points), with each
    decision marked where it was made (``marks``: label, step, "stopped", "promoted" or "exploited")."""
    figure, axes = plt.subplots(figsize=(12, 5), dpi=110)
    colors = plt.get_cmap("tab10")
    for index, (label, points) in enumerate(curves.items()):
        if not points:
            continue
        color = colors(index % 10)
        axes.plot([s for s, _ in points], [loss for _, loss in points], color=color, linewidth=1.2, label=label)
        losses = dict(points)
        for marked, step, what in marks:
            if marked != label or step not in losses:
                continue
            symbol = SWEEP_MARKS.get(what, SWEEP_MARKS["promoted"])[0]
            axes.plot([step], [losses[step]], marker=symbol, markersize=9, color=color, linestyle="none")
    for what, (symbol, words) in SWEEP_MARKS.items():
        if what != "exploited" or any(mark[2] == what for mark in marks):  # PBT's mark only in a PBT sweep
            axes.plot([], [], marker=symbol, color="gray", linestyle="none", label=words)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return png_path
