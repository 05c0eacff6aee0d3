"""Asynchronous checkpoints (train/checkpoints/async_checkpoint.py) against the Trainer's own synchronous save.

Correct before fast: the same training with the same seed saves the same checkpoint either way
(every tensor equal, the same trainer state, the same files), and a run resumed from an async
checkpoint ends with the weights of an uninterrupted run. Real Trainer, real files, a real
upload process; the store is a directory.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer, HostBuffers, Snapshot, SnapshotWriter
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME, complete_checkpoints, latest_complete_checkpoint
from spotray.train.checkpoints.direct_load import DirectLoadTrainer, direct_load_reason
from spotray.train.checkpoints.resume import fetch_resume_checkpoint
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.records.event_log import EventLog, read_events
from spotray.train.storage.store import LocalObjectStore
from tests.conftest import run_ranks, saved_steps_and_uploads_checked

pytestmark = [pytest.mark.integration, pytest.mark.core]

VOCAB, BLOCK = 64, 16
ROOT = Path(__file__).resolve().parents[2]


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int = 256) -> None:
        generator = torch.Generator().manual_seed(0)
        self.blocks = torch.randint(0, VOCAB, (count, BLOCK), generator=generator)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def tiny_gpt2() -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2)  # type: ignore[no-untyped-call]
    return GPT2LMHeadModel(config)  # type: ignore[no-untyped-call]


def make_trainer(
    trainer_class: type[Trainer],
    workdir: Path,
    callbacks: list[TrainerCallback],
    max_steps: int = 6,
    **arguments: Any,
) -> Trainer:
    """A seeded tiny GPT-2 (dropout on) saving at steps 3 and 6; ``arguments`` override TrainingArguments."""
    set_seed(7)
    args = TrainingArguments(
        output_dir=str(workdir / "checkpoints"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        save_strategy="steps",
        save_steps=3,
        save_total_limit=2,
        logging_steps=1,
        seed=7,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        **arguments,
    )
    return trainer_class(model=tiny_gpt2(), args=args, train_dataset=RandomTokens(), callbacks=callbacks)


def sync_callback(workdir: Path, *, async_save: bool) -> S3CheckpointCallback:
    store = LocalObjectStore(parse_uri(str(workdir / "store")))
    return S3CheckpointCallback(
        str(workdir / "store"), store=store, keep=3, staging_dir=workdir / "staging", async_save=async_save
    )


def assert_same(left: Any, right: Any, where: str) -> None:
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor), where
        assert left.dtype == right.dtype, where
        assert torch.equal(left, right), where
    elif isinstance(left, dict):
        assert isinstance(right, dict), where
        assert left.keys() == right.keys(), where
        for key in left:
            assert_same(left[key], right[key], f"{where}/{key}")
    elif isinstance(left, list | tuple):
        assert type(left) is type(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}/{index}")
    elif isinstance(left, np.ndarray):
        assert np.array_equal(left, right), where
    else:
        assert left == right, where


def assert_same_checkpoint(sync_dir: Path, async_dir: Path, rng_files: tuple[str, ...] = ("rng_state.pth",)) -> None:
    def names(root: Path) -> list[str]:
        return sorted(p.name for p in root.iterdir() if p.name != MANIFEST_NAME)

    assert names(sync_dir) == names(async_dir)
    assert set(rng_files) <= set(names(async_dir))
    assert_same(load_file(sync_dir / "model.safetensors"), load_file(async_dir / "model.safetensors"), "model")
    for name in ("optimizer.pt", "scheduler.pt", *rng_files):
        assert_same(
            torch.load(sync_dir / name, weights_only=False), torch.load(async_dir / name, weights_only=False), name
        )
    sync_state = json.loads((sync_dir / "trainer_state.json").read_text())
    async_state = json.loads((async_dir / "trainer_state.json").read_text())
    assert sync_state == async_state
    assert (sync_dir / "config.json").read_text() == (async_dir / "config.json").read_text()


def test_an_async_checkpoint_holds_what_the_synchronous_save_writes(tmp_path: Path) -> None:
    plain = make_trainer(Trainer, tmp_path / "sync", [sync_callback(tmp_path / "sync", async_save=False)])
    plain.train()
    taking = sync_callback(tmp_path / "async", async_save=True)
    fast = make_trainer(AsyncSaveTrainer, tmp_path / "async", [taking])
    fast.train()
    assert taking.snapshot_writer is not None
    assert taking.snapshot_writer.buffers.nbytes > 0  # the async path ran, not the Trainer's own save
    for step in (3, 6):
        name = f"checkpoint-{step}"
        assert_same_checkpoint(tmp_path / "sync/checkpoints" / name, tmp_path / "async/checkpoints" / name)
    latest = latest_complete_checkpoint(taking.store)
    assert latest is not None
    assert latest.step == 6
    stored = tmp_path / "async/store/checkpoint-6"
    assert_same_checkpoint(tmp_path / "sync/checkpoints/checkpoint-6", stored)  # the uploaded copy too
    assert not any((tmp_path / "async/staging").iterdir())


def test_under_ddp_every_ranks_rng_state_is_in_the_async_checkpoint(tmp_path: Path) -> None:
    """Two CPU processes (torchrun, gloo): the async checkpoint equals the synchronous one, both ranks' RNG too."""
    script = Path(__file__).with_name("ddp_checkpoint_script.py")
    run_ranks(script, [str(tmp_path), "sync", "async"], dict(os.environ))
    rng_files = ("rng_state_0.pth", "rng_state_1.pth")
    for step in (3, 6):
        name = f"checkpoint-{step}"
        assert_same_checkpoint(tmp_path / "sync/checkpoints" / name, tmp_path / "async/checkpoints" / name, rng_files)
    assert_same_checkpoint(tmp_path / "sync/store/checkpoint-6", tmp_path / "async/store/checkpoint-6", rng_files)


def test_a_process_killed_while_writing_a_snapshot_resumes_from_the_previous_checkpoint(tmp_path: Path) -> None:
    """SIGKILL inside the background write: nothing of that checkpoint is taken for complete, resume is exact."""
    script = Path(__file__).with_name("killed_write_script.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workdir = tmp_path / "cut"
    store = LocalObjectStore(parse_uri(str(workdir / "store")))
    command = [sys.executable, str(script), str(workdir)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    try:
        # The Trainer prints its logs there too; the line comes once the write of checkpoint-6 stalls.
        assert any("STALLED" in line for line in process.stdout), "the write of checkpoint-6 never started"
        deadline = time.monotonic() + 60  # checkpoint-3's upload goes on in the upload process meanwhile
        while not complete_checkpoints(store) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        process.kill()
        process.wait()
    assert (workdir / "checkpoints/checkpoint-6/model.safetensors").exists()  # half-written locally
    assert [c.step for c in complete_checkpoints(store)] == [3]
    resume = fetch_resume_checkpoint(store, workdir / "resume")
    assert resume is not None
    assert resume.step == 3
    resumed = make_trainer(AsyncSaveTrainer, workdir, [sync_callback(workdir, async_save=True)], max_steps=9)
    resumed.train(resume_from_checkpoint=str(resume.local_dir))
    whole = make_trainer(AsyncSaveTrainer, tmp_path / "whole", [sync_callback(tmp_path / "whole", async_save=True)], 9)
    whole.train()
    assert_same(whole.model.state_dict(), resumed.model.state_dict(), "final weights")


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def test_a_run_resumed_from_an_async_checkpoint_ends_with_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = make_trainer(AsyncSaveTrainer, tmp_path / "whole", [sync_callback(tmp_path / "whole", async_save=True)])
    whole.train()
    first = make_trainer(
        AsyncSaveTrainer, tmp_path / "cut", [sync_callback(tmp_path / "cut", async_save=True), StopAt(3)]
    )
    first.train()  # stops after the save at step 3: a preempted attempt
    random.seed(12345)  # a new process would not share the first attempt's RNG states
    torch.manual_seed(12345)
    resumed = make_trainer(AsyncSaveTrainer, tmp_path / "cut", [sync_callback(tmp_path / "cut", async_save=True)])
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut/checkpoints/checkpoint-3"))
    assert resumed.state.global_step == 6
    assert_same(whole.model.state_dict(), resumed.model.state_dict(), "final weights")


class SlowWriteTrainer(AsyncSaveTrainer):
    """A disk slower than the save interval (the fault, injected): each snapshot is written only once
    training has gone past step 6, the next save. A fixed delay (it was a second) stopped being
    enough on a loaded machine, where three steps took longer and 6 found the writer idle."""

    WRITE_AFTER_STEP = 6

    def _capture(self, buffers: HostBuffers, output_dir: Path) -> Callable[[], None]:
        write = super()._capture(buffers, output_dir)

        def slow_write() -> None:
            deadline = time.monotonic() + 120  # a bound, so a broken trainer fails the test, not hangs it
            while self.state.global_step <= self.WRITE_AFTER_STEP and time.monotonic() < deadline:
                time.sleep(0.05)
            write()

        return slow_write


def test_with_when_busy_skip_saves_during_a_write_are_skipped_but_never_the_last(tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    store = LocalObjectStore(parse_uri(str(tmp_path / "store")))
    sync = S3CheckpointCallback(
        str(tmp_path / "store"),
        store=store,
        keep=10,
        staging_dir=tmp_path / "staging",
        events=events,
        async_save=True,
        when_busy="skip",
    )
    trainer = make_trainer(SlowWriteTrainer, tmp_path, [sync], max_steps=9)
    trainer.train()
    skipped = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint_skipped"]
    # 6 came while 3 was still being written; 9, the last, waited
    assert saved_steps_and_uploads_checked(tmp_path / "events.jsonl", store) == [3, 9]
    assert [e["step"] for e in skipped] == [6]
    assert sync.snapshot_writer is not None
    assert sync.snapshot_writer.skipped == 1


def test_host_buffers_are_reused_and_keep_tied_weights_tied() -> None:
    model = tiny_gpt2()
    buffers = HostBuffers()
    first = buffers.copy("model", model.state_dict())
    assert first["lm_head.weight"] is first["transformer.wte.weight"]  # tied in the model, one buffer here
    size = buffers.nbytes
    with torch.no_grad():
        model.transformer.wte.weight.add_(1.0)
    second = buffers.copy("model", model.state_dict())
    assert second["transformer.wte.weight"].data_ptr() == first["transformer.wte.weight"].data_ptr()
    assert buffers.nbytes == size  # nothing new allocated
    assert torch.equal(second["transformer.wte.weight"], model.transformer.wte.weight)


class BufferSizeAtSaveTrainer(AsyncSaveTrainer):
    """Records how many bytes of host buffers exist as each save starts copying."""

    def _capture(self, buffers: HostBuffers, output_dir: Path) -> Callable[[], None]:
        self.buffer_bytes_at_save = [*getattr(self, "buffer_bytes_at_save", []), buffers.nbytes]
        return super()._capture(buffers, output_dir)


def test_the_first_save_finds_its_host_buffers_already_allocated(tmp_path: Path) -> None:
    """Allocating (pinning) the buffers took 1.2 s of GPT-2 124M's first save on an H200, 40 times
    its copy: they are allocated in the background after the first step, when the optimizer state
    they mirror exists, so no save pays for them."""
    sync = sync_callback(tmp_path, async_save=True)
    trainer = make_trainer(BufferSizeAtSaveTrainer, tmp_path, [sync])
    trainer.train()
    assert sync.snapshot_writer is not None
    whole = sync.snapshot_writer.buffers.nbytes
    assert whole > 0
    assert trainer.buffer_bytes_at_save == [whole, whole]  # type: ignore[attr-defined]


def test_reserved_host_buffers_are_the_ones_a_copy_fills() -> None:
    model = tiny_gpt2()
    buffers = HostBuffers()
    buffers.reserve("model", model.state_dict())
    size = buffers.nbytes
    copied = buffers.copy("model", model.state_dict())
    assert buffers.nbytes == size  # the copy allocated nothing: reserve made exactly its buffers
    assert copied["lm_head.weight"] is copied["transformer.wte.weight"]  # tied weights: one buffer
    assert torch.equal(copied["transformer.wte.weight"], model.transformer.wte.weight)


def test_a_save_while_the_previous_is_written_waits_or_is_skipped() -> None:
    skipping = SnapshotWriter("skip")
    waiting = SnapshotWriter("wait")
    release = time.monotonic() + 0.5

    def slow_write() -> None:
        time.sleep(max(0.0, release - time.monotonic()))

    for writer in (skipping, waiting):
        assert writer.begin(must_save=False)
        writer.write_in_background(_snapshot(1, slow_write), lambda _s: None)
    assert not skipping.begin(must_save=False)  # busy: this checkpoint is skipped, counted
    assert skipping.skipped == 1
    assert skipping.begin(must_save=True)  # the last save before stopping waits instead
    assert time.monotonic() >= release - 0.01
    assert waiting.begin(must_save=False)  # already written by now
    assert waiting.skipped == 0
    with pytest.raises(ValueError, match="when_busy"):
        SnapshotWriter("drop")


def _snapshot(step: int, write: Any) -> Snapshot:
    return Snapshot(step, Path("unused"), write, 0.0)


def test_a_direct_load_restores_what_the_trainers_own_loaders_restore(tmp_path: Path) -> None:
    """DirectLoadTrainer (weights and optimizer state read straight onto the device) against the stock loaders."""
    saving = make_trainer(Trainer, tmp_path / "save", [], max_steps=3)
    saving.train()
    checkpoint = str(tmp_path / "save/checkpoints/checkpoint-3")
    loaded = {}
    for trainer_class in (Trainer, DirectLoadTrainer):
        torch.manual_seed(999)  # other initial weights than the saved run's: the load must replace them all
        trainer = make_trainer(trainer_class, tmp_path / trainer_class.__name__, [])
        trainer.model = tiny_gpt2()
        trainer._load_from_checkpoint(checkpoint)  # type: ignore[no-untyped-call]
        trainer.create_optimizer_and_scheduler(num_training_steps=6)
        trainer._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
        assert trainer.optimizer is not None
        assert trainer.lr_scheduler is not None
        loaded[trainer_class] = (
            trainer.model.state_dict(),
            trainer.optimizer.state_dict(),
            trainer.lr_scheduler.state_dict(),
        )
        if trainer_class is DirectLoadTrainer:
            assert direct_load_reason(trainer, trainer.model) is None, "the direct path did not apply"
    assert_same(loaded[Trainer], loaded[DirectLoadTrainer], "loaded state")
    assert_same(saving.model.state_dict(), loaded[DirectLoadTrainer][0], "weights")
    model = tiny_gpt2()
    model.peft_config = {}  # what PEFT adds to a model
    assert direct_load_reason(saving, model) == "PEFT adapters load through the adapter's own loader"
