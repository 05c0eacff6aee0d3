"""``spec.checkpoint.everySteps: auto``: the checkpoint interval that maximises expected goodput.

Checkpointing often costs the time the training loop waits for each save; checkpointing rarely
costs the steps redone after an interruption (half an interval on average). Young (1974) and Daly
(2006): with checkpoint cost ``C`` and mean time between interruptions ``M``, the interval
``sqrt(2 * C * M)`` minimises the expected loss (when ``C`` is much smaller than ``M``). In steps:
that time over the step time, within ``minEverySteps`` and ``maxEverySteps``.

Where the numbers come from, all measured on this run:

- ``C``: the mean stall of its checkpoints so far (train/hf/callback.py measures each save), earlier
  attempts' included (their progress objects keep them). Before the first one, the first checkpoint
  comes after ``minEverySteps`` steps, which measures it.
- step time: the median of this worker group's recent steps, else earlier attempts' steps.
- ``M``: the run's training time observed so far over its interruptions (every earlier worker group
  ended before finishing: a lost node, a spot notice, a crash), with ``PRIOR_MTBI_S`` of
  uninterrupted training assumed up front, so a run that has seen no interruption yet neither
  checkpoints constantly nor never: ``M = (observed + PRIOR) / (interruptions + 1)``.

Rank 0 decides after each save and at the start, and every rank takes its decision (a broadcast):
a save is collective, so all must agree on the step. Each decision goes into the attempt's progress
object, and from there into ``status.checkpointInterval``.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.contract.spec import CheckpointSpec
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.processes.ranks import broadcast_from_rank0, world_rank
from spotray.train.records.goodput import Lifetime, attempts_from_progress
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter, read_run_progress
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)

# One hour of uninterrupted training assumed before any interruption is seen. Spot capacity is
# typically reclaimed after hours (AWS reports most instances under 5 % monthly interruption), so
# an hour errs on the side of checkpointing more, while the first interruptions correct it.
PRIOR_MTBI_S = 3600.0
STEP_WINDOW = 50  # recent steps the step time is the median of


@dataclass(frozen=True)
class RunHistory:
    """What the run's earlier worker groups tell about interruptions, checkpoint cost and speed."""

    interruptions: int = 0
    observed_s: float = 0.0  # training time, start of each group to its last step
    stalls_s: tuple[float, ...] = ()
    step_s: float | None = None

    @classmethod
    def from_lifetimes(cls, earlier: Iterable[Lifetime]) -> RunHistory:
        """The history of worker groups that ended (each one an interruption: the run went on after it)."""
        lifetimes = list(earlier)
        observed = 0.0
        gaps: list[float] = []
        for lifetime in lifetimes:
            if lifetime.points:
                began = lifetime.started_at if lifetime.started_at is not None else lifetime.points[0][2]
                observed += max(0.0, lifetime.points[-1][2] - began)
                steps = [(step, at) for step, _, at in lifetime.points]
                gaps += [(b - a) / (sb - sa) for (sa, a), (sb, b) in itertools.pairwise(steps) if sb > sa]
        return cls(
            interruptions=len(lifetimes),
            observed_s=observed,
            stalls_s=tuple(seconds for lifetime in lifetimes for _, seconds in lifetime.checkpoint_stalls),
            step_s=statistics.median(gaps[-STEP_WINDOW:]) if gaps else None,
        )


def run_history(store: ObjectStore, current: AttemptProgress) -> RunHistory:
    """The history before this worker group: earlier attempts' progress objects, and the earlier groups of
    this attempt (``current``, as continued by ``continue_attempt_progress``). Best effort: an unreadable
    store gives an empty history, which only makes the first interval ``minEverySteps``."""
    try:
        earlier = [p for p in read_run_progress(store, current.run_id) if p.attempt < current.attempt]
    except Exception as error:  # noqa: BLE001 - the interval must not stop training
        log.warning("could not read the run's earlier progress for everySteps: auto: %s", error)
        earlier = []
    return RunHistory.from_lifetimes(attempts_from_progress([*earlier, current])[:-1])


@dataclass(frozen=True)
class IntervalDecision:
    """One choice of the interval, with the numbers it came from."""

    steps: int
    target_s: float | None  # None: no checkpoint cost measured yet (the first interval is minEverySteps)
    checkpoint_s: float | None
    step_s: float | None
    mtbi_s: float
    interruptions: int
    observed_s: float
    min_steps: int
    max_steps: int

    def to_status(self) -> dict[str, Any]:
        """status.checkpointInterval (the controller copies it from the progress object)."""
        numbers = {
            "steps": self.steps,
            "targetSeconds": _rounded(self.target_s),
            "checkpointSeconds": _rounded(self.checkpoint_s),
            "stepSeconds": _rounded(self.step_s),
            "meanSecondsBetweenInterruptions": _rounded(self.mtbi_s),
            "interruptions": self.interruptions,
            "observedSeconds": _rounded(self.observed_s),
            "minSteps": self.min_steps,
            "maxSteps": self.max_steps,
        }
        return {key: value for key, value in numbers.items() if value is not None}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def mean_time_between_interruptions(observed_s: float, interruptions: int, prior_s: float = PRIOR_MTBI_S) -> float:
    return (observed_s + prior_s) / (interruptions + 1)


def choose_interval(  # noqa: PLR0917 - the formula's inputs, each named
    checkpoint_s: float | None,
    step_s: float | None,
    observed_s: float,
    interruptions: int,
    min_steps: int,
    max_steps: int,
    prior_s: float = PRIOR_MTBI_S,
) -> IntervalDecision:
    """Young/Daly's interval in steps, within [min_steps, max_steps]; min_steps until it can be computed."""
    mtbi = mean_time_between_interruptions(observed_s, interruptions, prior_s)
    target = None
    steps = min_steps
    if checkpoint_s is not None and step_s is not None and step_s > 0:
        target = math.sqrt(2.0 * max(checkpoint_s, 0.0) * mtbi)
        steps = max(min_steps, min(max_steps, round(target / step_s)))
    return IntervalDecision(steps, target, checkpoint_s, step_s, mtbi, interruptions, observed_s, min_steps, max_steps)


class AutoCheckpointInterval(TrainerCallback):
    """Saves at the interval ``choose_interval`` gives, decided anew after every save (rank 0's choice).

    Use it with the Trainer's own saving off (``save_strategy="no"``): it sets ``should_save``.
    ``history`` (rank 0): the run's earlier worker groups; ``progress`` (rank 0): where each
    decision is recorded.
    """

    def __init__(
        self,
        spec: CheckpointSpec,
        sync: S3CheckpointCallback,
        history: RunHistory | None = None,
        progress: ProgressWriter | None = None,
        prior_s: float = PRIOR_MTBI_S,
    ) -> None:
        self.spec = spec
        self.sync = sync
        self.history = history or RunHistory()
        self.progress = progress
        self.prior_s = prior_s
        self.next_save_step = 0
        self.decision: IntervalDecision | None = None
        self._stalls = list(self.history.stalls_s)
        self._step_gaps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._last_step_end: float | None = None
        self._began = time.monotonic()

    def _decide(self) -> int:
        """Rank 0's choice of the next interval, in steps (recorded in the progress object)."""
        step_s = statistics.median(self._step_gaps) if self._step_gaps else self.history.step_s
        self.decision = choose_interval(
            statistics.fmean(self._stalls) if self._stalls else None,
            step_s,
            self.history.observed_s + (time.monotonic() - self._began),
            self.history.interruptions,
            self.spec.min_every_steps,
            self.spec.max_every_steps,
            self.prior_s,
        )
        if self.progress is not None:
            self.progress.record_checkpoint_interval(self.decision.to_status())
        return self.decision.steps

    def _plan_next(self, step: int) -> None:
        every = self._decide() if world_rank() == 0 else 0
        self.next_save_step = step + int(broadcast_from_rank0(every))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._began = time.monotonic()
        self._plan_next(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        now = time.monotonic()
        if self._last_step_end is not None:
            self._step_gaps.append(now - self._last_step_end)
        self._last_step_end = now
        if state.global_step >= self.next_save_step:
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # After the S3 callback's on_save (it comes first in the list), which measured this save's stall.
        stall = self.sync.stall_at(state.global_step)
        if stall is not None:
            self._stalls.append(stall)
        self._last_step_end = None  # the next step's gap would include the save
        self._plan_next(state.global_step)
