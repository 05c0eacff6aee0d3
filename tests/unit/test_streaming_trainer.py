"""StreamingTrainer resume is exact: same batches and the same random state, so the same weights.

The Trainer restores its RNG state only when it skips already-trained batches; StreamingTrainer
never skips (the data position does that), so it must restore the RNG itself. With dropout on, a
resume that does not gets different weights from an uninterrupted run (found by the chaos runs).
"""

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

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


def train(
    output: Path, *, stop_at: int | None = None, resume_from: int | None = None
) -> tuple[dict[str, torch.Tensor], int]:
    """The weights at the end, and the number of steps this call trained."""
    set_seed(SEED)
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.5, embd_pdrop=0.5)
    model = GPT2LMHeadModel(config)
    start = DataPosition(0, (resume_from or 0) * BATCH)
    loader = EpochLoader(
        samples()[start.sample_in_epoch :], batch_size=BATCH, world_size=1, start=start, collate_fn=collate
    )
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
