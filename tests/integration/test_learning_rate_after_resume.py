"""A learning rate given to a resumed run takes effect (train/hf/learning_rate.py), in a real Trainer:
without the callback the Trainer's resume brings back the checkpoint's rate, which population-based
training's perturbed rate would silently lose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.train import build_trainer
from spotray.train.hf.learning_rate import LearningRateAfterResume

pytestmark = [pytest.mark.integration]

STEPS, SAVED_AT = 8, 4
OLD_RATE, NEW_RATE = 1e-3, 4e-3


class FirstStepRate(TrainerCallback):
    """The scheduler's base rates and the optimizer's rate as the first step after the resume begins."""

    def __init__(self) -> None:
        self.seen: tuple[list[float], float, float, float] | None = None

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.seen is None:
            scheduler, optimizer = kwargs["lr_scheduler"], kwargs["optimizer"]
            rate, logged = optimizer.param_groups[0]["lr"], scheduler.get_last_lr()[0]
            self.seen = (list(scheduler.base_lrs), rate, scheduler.lr_lambdas[0](SAVED_AT), logged)


def resumed_rates(tmp_path: Path, callbacks: list[TrainerCallback]) -> tuple[list[float], float, float, float]:
    first = Gpt2JobConfig(workdir=tmp_path, max_steps=STEPS, batch_size=4, learning_rate=OLD_RATE)
    build_trainer(first, [], save_steps=SAVED_AT).train()
    seen = FirstStepRate()
    resumed = Gpt2JobConfig(workdir=tmp_path, max_steps=STEPS, batch_size=4, learning_rate=NEW_RATE)
    build_trainer(resumed, [*callbacks, seen], save_steps=SAVED_AT).train(
        resume_from_checkpoint=str(tmp_path / "checkpoints" / f"checkpoint-{SAVED_AT}")
    )
    assert seen.seen is not None
    return seen.seen


def test_the_trainer_alone_resumes_with_the_checkpoints_rate(tmp_path: Path) -> None:
    base, _, _, _ = resumed_rates(tmp_path, [])
    assert set(base) == {OLD_RATE}, "the Trainer changed: the callback may no longer be needed"


def test_a_new_rate_given_to_a_resumed_run_takes_effect_where_its_schedule_is(tmp_path: Path) -> None:
    base, rate, factor, logged = resumed_rates(tmp_path, [LearningRateAfterResume(NEW_RATE)])
    assert set(base) == {NEW_RATE}, "every parameter group's (decayed and not)"
    assert rate == pytest.approx(NEW_RATE * factor)
    assert 0 < factor < 1, "mid-schedule: the rate is the new peak times the schedule's factor there"
    assert logged == rate, "the rate the Trainer logs for the step is the one it trains with"
