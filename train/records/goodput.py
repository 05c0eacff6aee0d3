"""How much of a run's wall time went into steps that survived, and where the rest went: the goodput ledger.

A run is a sequence of worker-group lifetimes (``Lifetime``): each controller attempt has one, and
one more each time Ray Train restarts its workers inside the attempt. A lifetime trains from the
step it resumed from; whatever it trained past the step the next lifetime resumed from was redone.
Goodput is the time of the steps that survived, divided by the wall time.

Where the wall time went (``Ledger.lost_s``; the parts and the surviving step time add up to it):

- ``waitingForCapacity``: from an attempt being asked for (the controller created its RayJob) to
  its workers running the training loop: nodes to come, pods and Ray to start. Local runs have none.
- ``startUp``: the first lifetime's time before its first step (start-up, dataset, model).
- ``restarts``: between a lifetime's last step and the next one's first step, less any waiting for
  capacity: noticing the loss, restarting, fetching the checkpoint, the first step again.
- ``redoneSteps``: the time of steps that a later lifetime trained again.
- ``checkpointBlocking``: how long the training loop waited for the saves of surviving steps
  (the Trainer's local write and staging; the upload runs in the background).
- ``other``: the rest, mostly after the last step (the final upload, shutting down).

A step's time is the gap between its point and the previous point of the same lifetime, so a
lifetime's first step (which includes start-up) counts as lost time, as start-up should.

The lifetimes come from a local run's event log (``split_lifetimes``) or from the progress objects
every attempt keeps next to the checkpoints (``attempts_from_progress``: the controller and
``spotray plot``). The controller keeps only each ended attempt's ``Tally``, not its points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotray.train.records.progress_log import AttemptProgress

CAUSES = ("waitingForCapacity", "startUp", "restarts", "redoneSteps", "checkpointBlocking", "other")


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
    requested_at: float | None = None  # the attempt was asked for (its RayJob created); None locally
    started_at: float | None = None  # its workers began the training loop
    checkpoint_stalls: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds waited)

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
            restart = bool(lifetimes) and attempt == previous
            started = float(at) if isinstance(at, int | float) else None
            lifetimes.append(Lifetime(attempt, event.get("resumed_from"), restart=restart, started_at=started))
        elif not lifetimes:
            continue
        elif kind == "step":
            lifetimes[-1].points.append((int(event["step"]), float(event["loss"]), float(event.get("time", 0.0))))
        elif kind == "checkpoint_saved" and isinstance(event.get("blocked_s"), int | float):
            lifetimes[-1].checkpoint_stalls.append((int(event["step"]), float(event["blocked_s"])))
        elif kind == "checkpoint_complete":
            lifetimes[-1].checkpoints.append(int(event["step"]))
        elif kind == "preemption_notice" and lifetimes[-1].notice_step is None:
            lifetimes[-1].notice_step = int(event["step"])
        elif kind == "end":
            lifetimes[-1].finished = True
    return lifetimes, first, last


def attempts_from_progress(
    progress: Iterable[AttemptProgress], requested: Mapping[int, float] | None = None
) -> list[Lifetime]:
    """The lifetimes the run's progress objects tell: one per attempt, one more per worker restart in it.

    ``requested``: when each attempt was asked for (attempt number -> unix time; the controller's
    status.attempts[].startTime). Only the newest lifetime may still be going (or done).
    """
    lifetimes: list[Lifetime] = []
    for attempt in progress:
        # A restart's points are those logged after it: the earlier group's stay where they were.
        cuts = [(attempt.resumed_from, attempt.started), *((step, at) for step, at in attempt.restarts)]
        for index, (resumed_from, started) in enumerate(cuts):
            until = cuts[index + 1][1] if index + 1 < len(cuts) else None
            since = started if index else None

            def within(at: float, since: float | None = since, until: float | None = until) -> bool:
                return (since is None or at >= since) and (until is None or at < until)

            lifetimes.append(
                Lifetime(
                    attempt.attempt,
                    resumed_from,
                    [point for point in attempt.points if within(point[2])],
                    restart=index > 0,
                    requested_at=(requested or {}).get(attempt.attempt) if index == 0 else None,
                    started_at=started,
                    checkpoint_stalls=[
                        (step, seconds) for step, seconds, at in attempt.checkpoint_stalls if within(at)
                    ],
                )
            )
    if lifetimes:
        lifetimes[-1].finished = True  # nothing came after it, so nothing shows it was cut short
    return lifetimes


@dataclass(frozen=True)
class Tally:
    """What one lifetime adds to the ledger, given the step later lifetimes kept its work up to.

    Small and final for a lifetime that ended: the controller keeps these for a run's past attempts
    instead of their points.
    """

    attempt: int
    restart: bool
    notice: bool
    requested_at: float | None
    started_at: float | None
    first_point_at: float | None
    last_point_at: float | None
    surviving_s: float  # its surviving steps' time, less the checkpoint stalls among them
    checkpoint_blocking_s: float  # the stalls among its surviving steps
    redone_s: float  # the time of its steps that a later lifetime trained again
    steps_redone: int


def tally(lifetime: Lifetime, kept_up_to: float) -> Tally:
    """``lifetime``'s part of the ledger when its steps up to ``kept_up_to`` survived (inf: all did)."""
    surviving = redone = 0.0
    for (_, _, before), (step, _, at) in zip(lifetime.points, lifetime.points[1:], strict=False):
        if step <= kept_up_to:
            surviving += max(0.0, at - before)
        else:
            redone += max(0.0, at - before)
    blocking = sum(seconds for step, seconds in lifetime.checkpoint_stalls if step <= kept_up_to)
    blocking = min(blocking, surviving)  # a stall is inside its step's gap; never more than the gaps
    return Tally(
        attempt=lifetime.attempt,
        restart=lifetime.restart,
        notice=lifetime.notice_step is not None,
        requested_at=lifetime.requested_at,
        started_at=lifetime.started_at,
        first_point_at=lifetime.points[0][2] if lifetime.points else None,
        last_point_at=lifetime.points[-1][2] if lifetime.points else None,
        surviving_s=surviving - blocking,
        checkpoint_blocking_s=blocking,
        redone_s=redone,
        steps_redone=(
            max(0, lifetime.last_step - max(int(kept_up_to), lifetime.resumed_from or 0))
            if kept_up_to != float("inf")
            else 0
        ),
    )


def kept_up_to(lifetimes: list[Lifetime]) -> list[float]:
    """For each lifetime, the step up to which its work survived: the lowest resume of any later lifetime."""
    kept = []
    lowest = float("inf")
    for lifetime in reversed(lifetimes):
        kept.append(lowest)
        lowest = min(lowest, lifetime.resumed_from or 0)
    return kept[::-1]


def lost_time_summary(lost_s: Mapping[str, float]) -> str:
    """Lost time by cause, biggest first: "restarts 41 s, redoneSteps 12 s, ..." (what rounds to 0 s is left out).

    For a ``Ledger`` and for status.goodput's lostSeconds alike.
    """
    parts = sorted(((seconds, cause) for cause, seconds in lost_s.items() if seconds >= 0.5), reverse=True)
    return ", ".join(f"{cause} {seconds:.0f} s" for seconds, cause in parts) or "nothing"


@dataclass(frozen=True)
class Ledger:
    """Where a run's wall time went."""

    wall_s: float
    surviving_step_s: float  # time of the steps whose results the final model carries
    lost_s: dict[str, float]  # by cause (CAUSES); with surviving_step_s they add up to wall_s
    redone_per_resume: tuple[int, ...]  # steps trained again after each resume
    attempts: int
    worker_restarts: int
    spot_notices: int

    @property
    def steps_redone(self) -> int:
        return sum(self.redone_per_resume)

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

    def lost_summary(self) -> str:
        return lost_time_summary(self.lost_s)

    def to_status(self) -> dict[str, Any]:
        """status.goodput: whole seconds (sub-second changes would be a status write for nothing)."""
        return {
            "ratio": round(self.goodput, 3),
            "wallSeconds": round(self.wall_s),
            "survivingStepSeconds": round(self.surviving_step_s),
            "lostSeconds": {cause: round(seconds) for cause, seconds in self.lost_s.items()},
            "stepsRedone": list(self.redone_per_resume),
            "workerRestarts": self.worker_restarts,
        }


def ledger_of(tallies: list[Tally], first_at: float, last_at: float) -> Ledger:
    """The ledger of a run's lifetimes (as ``tally`` counted them) between ``first_at`` and ``last_at``."""
    lost = dict.fromkeys(CAUSES, 0.0)
    anchor = first_at  # where the time before the next first step began: the run's start, then a last step
    waiting = 0.0  # waiting for capacity since ``anchor``, of lifetimes with or without steps
    seen_steps = False
    for counted in tallies:
        if counted.requested_at is not None and counted.started_at is not None:
            waiting += max(0.0, counted.started_at - max(counted.requested_at, anchor))
        if counted.first_point_at is None or counted.last_point_at is None:
            continue  # lost before its first step: its time is in the gap before the next first step
        gap = max(0.0, counted.first_point_at - anchor)
        waited = min(waiting, gap)
        lost["waitingForCapacity"] += waited
        lost["startUp" if not seen_steps else "restarts"] += gap - waited
        lost["redoneSteps"] += counted.redone_s
        lost["checkpointBlocking"] += counted.checkpoint_blocking_s
        anchor, waiting, seen_steps = counted.last_point_at, 0.0, True
    wall = max(0.0, last_at - first_at)
    surviving = sum(counted.surviving_s for counted in tallies)
    lost["other"] = max(0.0, wall - surviving - sum(lost.values()))
    return Ledger(
        wall_s=wall,
        surviving_step_s=surviving,
        lost_s=lost,
        redone_per_resume=tuple(counted.steps_redone for counted in tallies[:-1]),
        attempts=len({counted.attempt for counted in tallies}),
        worker_restarts=sum(counted.restart for counted in tallies),
        spot_notices=sum(counted.notice for counted in tallies),
    )


def ledger(lifetimes: list[Lifetime], first_event: float, last_event: float) -> Ledger:
    """The ledger of a run told by its lifetimes, from its first event to its last."""
    return ledger_of(
        [tally(lt, kept) for lt, kept in zip(lifetimes, kept_up_to(lifetimes), strict=True)], first_event, last_event
    )
