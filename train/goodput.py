"""How much of a run's wall time went into steps that survived: the goodput ledger.

A run is a sequence of worker-group lifetimes (``Lifetime``): each controller attempt has one, and
one more each time Ray Train restarts its workers inside the attempt. A lifetime trains from the
step it resumed from; whatever it trained past the step the next lifetime resumed from was redone.
Goodput is the time of the steps that survived, divided by the wall time from the first event to
the last: restarts, start-up, redone steps and checkpoint stalls are all in the difference.

A step's time is the gap between its log event and the previous one of the same lifetime, so a
lifetime's first step (which includes start-up) counts as lost time, as start-up should.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Lifetime:
    """One worker group's lifetime: a controller attempt, or a restart of its workers inside one."""

    attempt: int  # the controller attempt it belongs to
    resumed_from: int | None
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, loss, time)
    checkpoints: list[int] = field(default_factory=list)
    finished: bool = False
    restart: bool = False  # a restart of the workers inside ``attempt``, not a new attempt
    notice_step: int | None = None  # a spot notice arrived at this step (an emergency checkpoint follows)

    @property
    def last_step(self) -> int:
        return self.points[-1][0] if self.points else (self.resumed_from or 0)


def split_lifetimes(events: Iterable[dict[str, Any]]) -> tuple[list[Lifetime], float | None, float | None]:
    """The lifetimes of a run's event log, and the times of its first and last events.

    Each ``start`` event opens a lifetime; one with the same ``attempt`` number as the lifetime
    before it is a restart of the workers inside that attempt (logs written before the number was
    recorded count every start as an attempt).
    """
    lifetimes: list[Lifetime] = []
    first = last = None
    for event in events:
        at = event.get("time")
        if isinstance(at, int | float):
            first = at if first is None else min(first, at)
            last = at if last is None else max(last, at)
        kind = event.get("event")
        if kind == "start":
            number = event.get("attempt")
            previous = lifetimes[-1].attempt if lifetimes else 0
            attempt = number if isinstance(number, int) else previous + 1
            lifetimes.append(
                Lifetime(attempt, event.get("resumed_from"), restart=bool(lifetimes) and attempt == previous)
            )
        elif not lifetimes:
            continue
        elif kind == "step":
            lifetimes[-1].points.append((int(event["step"]), float(event["loss"]), float(event.get("time", 0.0))))
        elif kind == "checkpoint_complete":
            lifetimes[-1].checkpoints.append(int(event["step"]))
        elif kind == "preemption_notice" and lifetimes[-1].notice_step is None:
            lifetimes[-1].notice_step = int(event["step"])
        elif kind == "end":
            lifetimes[-1].finished = True
    return lifetimes, first, last


@dataclass(frozen=True)
class Ledger:
    """Where a run's wall time went."""

    wall_s: float
    surviving_step_s: float  # time of the steps whose results the final model carries
    steps_redone: int  # steps trained again after a resume, summed over resumes
    attempts: int
    worker_restarts: int
    spot_notices: int

    @property
    def goodput(self) -> float:
        return self.surviving_step_s / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> str:
        restarts = f", {self.worker_restarts} worker restart(s)" if self.worker_restarts else ""
        notices = f", {self.spot_notices} spot notice(s)" if self.spot_notices else ""
        return (
            f"{self.attempts} attempt(s){restarts}{notices}; goodput {self.goodput:.2f} "
            f"({self.surviving_step_s:.0f} s of {self.wall_s:.0f} s in steps that survived, "
            f"{self.steps_redone} step(s) redone)"
        )


def ledger(lifetimes: list[Lifetime], first_event: float, last_event: float) -> Ledger:
    """The ledger of a run told by its lifetimes (``split_lifetimes``)."""
    surviving = 0.0
    redone = 0
    # Walk back from the last lifetime: a step survives when no later lifetime resumed from below it.
    kept_up_to = float("inf")
    for lifetime in reversed(lifetimes):
        for (_, _, before), (step, _, at) in zip(lifetime.points, lifetime.points[1:], strict=False):
            if step <= kept_up_to:
                surviving += max(0.0, at - before)
        redone += sum(step > kept_up_to for step, _, _ in lifetime.points)
        kept_up_to = min(kept_up_to, lifetime.resumed_from or 0)
    return Ledger(
        wall_s=max(0.0, last_event - first_event),
        surviving_step_s=surviving,
        steps_redone=redone,
        attempts=len({lifetime.attempt for lifetime in lifetimes}),
        worker_restarts=sum(lifetime.restart for lifetime in lifetimes),
        spot_notices=sum(lifetime.notice_step is not None for lifetime in lifetimes),
    )
