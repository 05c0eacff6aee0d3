"""StreamingTrainer resume is exact: same batches and the same random state, so the same weights.

The Trainer restores its RNG state only when it skips already-trained batches; StreamingTrainer
never skips (the data position does that), so it must restore the RNG itself. With dropout on, a
resume that does not gets different weights from an uninterrupted run (found by the chaos runs).
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

from spotray.contract.errors import SpotrayError
from spotray.train.hf.data import DataPosition, EpochLoader, StreamingTrainer

pytestmark = [pytest.mark.unit]

STEPS, SAVE_AT, BATCH, SEED = 6, 3, 2, 7


def samples() -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(0)
    # An epoch longer than the run, as a real dataset is: the Trainer then counts the resumed steps as
    # trained within the current epoch, and nothing stops it before its first step.
    return [{"input_ids": torch.randint(0, 32, (8,), generator=generator)} for _ in range(3 * STEPS * BATCH)]


def collate(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    ids = torch.stack([sample["input_ids"] for sample in batch])
    return {"input_ids": ids, "labels": ids}


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True
        return control


class Epochs(IterableDataset[dict[str, Any]]):
    """Epochs of ``samples``, the first one continued from sample ``start``: what a streaming dataset
    gives after ``load_state_dict`` (each iteration an epoch, the resumed one from where it was)."""

    def __init__(self, samples: list[dict[str, Any]], start: int) -> None:
        self.samples, self.start = samples, start

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start, self.start = self.start, 0
        return iter(self.samples[start:])


def train(
    output: Path, *, stop_at: int | None = None, resume_from: int | None = None, epoch: int | None = None
) -> tuple[dict[str, torch.Tensor], int]:
    """The weights at the end, and the number of steps this call trained; ``epoch``: samples per epoch
    (unset: one epoch longer than the run)."""
    set_seed(SEED)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.5, embd_pdrop=0.5)
    model = GPT2LMHeadModel(config)
    trained_samples = (resume_from or 0) * BATCH
    if epoch is None:
        start = DataPosition(0, trained_samples)
        dataset: Any = samples()[start.sample_in_epoch :]
    else:
        start = DataPosition(trained_samples // epoch, trained_samples % epoch)
        if trained_samples and not start.sample_in_epoch:  # the position a save on an epoch's last batch records
            start = DataPosition(start.epoch - 1, epoch)
        dataset = Epochs(samples()[:epoch], start.sample_in_epoch)
    loader = EpochLoader(dataset, batch_size=BATCH, world_size=1, start=start, collate_fn=collate)
    args = TrainingArguments(
        output_dir=str(output),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=SEED,
        ignore_data_skip=True,
        logging_steps=1,
    )
    trainer = StreamingTrainer(
        model=model, args=args, epoch_loader=loader, callbacks=[StopAt(stop_at)] if stop_at else []
    )
    checkpoint = str(output / f"checkpoint-{resume_from}") if resume_from else None
    trainer.train(resume_from_checkpoint=checkpoint)
    trained = trainer.state.global_step - (resume_from or 0)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}, trained


def test_a_resumed_run_with_dropout_ends_with_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    uninterrupted, _ = train(tmp_path / "a")
    train(tmp_path / "b", stop_at=SAVE_AT)
    resumed, _ = train(tmp_path / "b", resume_from=SAVE_AT)
    differing = [name for name in uninterrupted if not torch.equal(uninterrupted[name], resumed[name])]
    assert not differing, f"{len(differing)} tensors differ after resume, e.g. {differing[0]}"


def test_a_run_resumed_from_its_last_step_trains_nothing(tmp_path: Path) -> None:
    """An attempt that ended after its final checkpoint was complete (a node lost before the driver
    reported success) resumes there: it must not train step max_steps + 1 (the cluster demo did)."""
    finished, trained = train(tmp_path / "a", stop_at=STEPS)
    assert trained == STEPS
    resumed, trained_again = train(tmp_path / "a", resume_from=STEPS)
    assert trained_again == 0
    assert all(torch.equal(finished[name], resumed[name]) for name in finished)


def test_a_run_resumed_from_an_epochs_last_batch_trains_on_into_the_next_epoch(tmp_path: Path) -> None:
    """A save on an epoch's last batch (the head-to-head's emergency checkpoint at step 912, two epochs of
    456 steps) records a position where no full batch of that epoch is left. The Trainer took the empty
    epoch for the end of the data: the attempt trained nothing and the run ended Succeeded at step 912 of
    1800. It must go on with the next epoch, the batches the uninterrupted run trained."""
    epoch = SAVE_AT * BATCH
    uninterrupted, trained = train(tmp_path / "a", epoch=epoch)
    assert trained == STEPS
    train(tmp_path / "b", stop_at=SAVE_AT, epoch=epoch)
    resumed, trained_after = train(tmp_path / "b", resume_from=SAVE_AT, epoch=epoch)
    assert trained_after == STEPS - SAVE_AT
    differing = [name for name in uninterrupted if not torch.equal(uninterrupted[name], resumed[name])]
    assert not differing, f"{len(differing)} tensors differ after resume, e.g. {differing[0]}"


def test_a_dataset_without_one_global_batch_per_epoch_is_refused_not_trained_for_no_steps(tmp_path: Path) -> None:
    """The Trainer ends at step 0 on an empty epoch, and the run would say Succeeded."""
    with pytest.raises(SpotrayError, match="fewer samples than one global batch"):
        train(tmp_path / "a", epoch=BATCH - 1)
