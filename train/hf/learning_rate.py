"""The learning rate a job is given, applied after a resume too.

Hugging Face's Trainer restores the optimizer and the scheduler from the checkpoint it resumes from,
the scheduler's base learning rates included, so a learning rate given to a resumed run is silently
ignored: the schedule goes on from the old one. Population-based training resumes a trial from
another trial's checkpoint with a perturbed learning rate (docs/sweeps.md), and a person may lower
the rate of a run that diverged; both need the new rate to take effect.

``LearningRateAfterResume`` runs when training begins, after the Trainer has loaded the checkpoint:
it sets the scheduler's base rate, and each parameter group's current rate where the schedule puts
it at this step (a LambdaLR's ``base * lambda(step)``, as the scheduler itself computes it). The same
rate as the checkpoint's changes nothing, so an ordinary resume stays exact.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger(__name__)


class LearningRateAfterResume(TrainerCallback):
    def __init__(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if optimizer is None or scheduler is None or lambdas is None:
            return  # no LambdaLR (the Trainer's schedules all are): nothing this knows how to set
        groups = optimizer.param_groups
        if list(scheduler.base_lrs) == [self.learning_rate] * len(groups):
            return  # a fresh start, or a resume with the rate it was saved with
        log.info(
            "learning rate %s after the resume at step %d (the checkpoint's: %s)",
            self.learning_rate,
            state.global_step,
            scheduler.base_lrs,
        )
        scheduler.base_lrs = [self.learning_rate] * len(groups)
        for group, factor in zip(groups, lambdas, strict=True):
            group["initial_lr"] = self.learning_rate
            group["lr"] = self.learning_rate * factor(scheduler.last_epoch)
        # What get_last_lr() says (the Trainer logs it) until the scheduler's next step: the rate now in use.
        scheduler._last_lr = [group["lr"] for group in groups]
