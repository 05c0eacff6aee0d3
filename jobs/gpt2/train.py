"""Train a small GPT-2 (built from config) on the byte-level docs corpus, resumable from S3.

    python -m jobs.gpt2 --checkpoint-uri s3://checkpoints/gpt2-demo --max-steps 400

At start the newest complete checkpoint under ``--checkpoint-uri`` is fetched and training resumes
from it (model, optimizer, scheduler, RNG and data position); with none, training starts fresh.
Every checkpoint the Trainer saves is synced to the URI in the background. S3 endpoint and
credentials come from the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from jobs.gpt2.data import VOCAB_SIZE, ByteBlocks, corpus_bytes
from train.callback import S3CheckpointCallback
from train.errors import SpotrayError
from train.events import EventLog
from train.resume import fetch_resume_checkpoint
from train.store import open_store

log = logging.getLogger("jobs.gpt2")


@dataclass(frozen=True)
class Gpt2JobConfig:
    checkpoint_uri: str
    workdir: Path
    max_steps: int = 400
    save_steps: int = 25
    keep: int = 3
    seed: int = 42
    batch_size: int = 16
    block_size: int = 128
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    learning_rate: float = 3e-3
    create_bucket: bool = False
    events_path: Path | None = None


class StepEvents(TrainerCallback):
    """Emit one ``step`` event per logged step (loss, learning rate) to the event log."""

    def __init__(self, events: EventLog) -> None:
        self.events = events

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs and "loss" in logs:
            self.events.emit(
                "step",
                step=state.global_step,
                loss=logs["loss"],
                lr=logs.get("learning_rate"),
                max_steps=state.max_steps,
            )


def build_model(config: Gpt2JobConfig) -> GPT2LMHeadModel:
    model_config = GPT2Config(  # type: ignore[no-untyped-call]
        vocab_size=VOCAB_SIZE,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(model_config)  # type: ignore[no-untyped-call]


def build_training_args(config: Gpt2JobConfig, *, save_steps: int | None = None) -> TrainingArguments:
    save = save_steps if save_steps is not None else config.save_steps
    return TrainingArguments(
        output_dir=str(config.workdir / "checkpoints"),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, config.max_steps // 20),
        weight_decay=0.01,
        logging_steps=1,
        save_strategy="steps" if save > 0 else "no",
        save_steps=save if save > 0 else 500,
        save_total_limit=2,  # local copies only; the store keeps `keep` of its own
        seed=config.seed,
        full_determinism=True,
        use_cpu=True,
        dataloader_num_workers=0,
        report_to=[],
        disable_tqdm=True,
    )


def build_trainer(config: Gpt2JobConfig, callbacks: list[TrainerCallback], *, save_steps: int | None = None) -> Trainer:
    set_seed(config.seed)
    trainer: Trainer = Trainer(
        model=build_model(config),
        args=build_training_args(config, save_steps=save_steps),
        train_dataset=ByteBlocks(corpus_bytes(), config.block_size),
        callbacks=callbacks,
    )
    return trainer


def run(config: Gpt2JobConfig) -> Path:
    """Train to ``max_steps`` (resuming if a checkpoint exists); return the final checkpoint's local dir."""
    events = EventLog(config.events_path)
    store = open_store(config.checkpoint_uri)
    store.check(create_bucket=config.create_bucket)
    resume_point = fetch_resume_checkpoint(store, config.workdir / "resume")
    events.emit(
        "start",
        pid=os.getpid(),
        resumed_from=resume_point.step if resume_point else None,
        checkpoint_uri=config.checkpoint_uri,
        max_steps=config.max_steps,
    )
    if resume_point:
        log.info("resuming from %s (step %d)", resume_point.uri, resume_point.step)
    else:
        log.info("no complete checkpoint under %s: starting fresh", config.checkpoint_uri)
    sync = S3CheckpointCallback(config.checkpoint_uri, keep=config.keep, store=store, events=events)
    trainer = build_trainer(config, [sync, StepEvents(events)])
    trainer.train(resume_from_checkpoint=str(resume_point.local_dir) if resume_point else None)
    final = Path(str(trainer.args.output_dir)) / f"checkpoint-{trainer.state.global_step}"
    events.emit("end", step=trainer.state.global_step, final_uri=str(store.uri.join(final.name)))
    return final


def parse_args(argv: list[str] | None = None) -> Gpt2JobConfig:
    parser = argparse.ArgumentParser(prog="python -m jobs.gpt2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-uri", required=True, help="s3://bucket/prefix or file:///path for checkpoints")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-gpt2", help="local scratch directory"
    )
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--save-steps", type=int, default=25, help="checkpoint every N steps")
    parser.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep in the store")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--n-layer", type=int, default=2, help="transformer blocks")
    parser.add_argument("--n-embd", type=int, default=128, help="embedding width (a multiple of 4 heads)")
    parser.add_argument("--create-bucket", action="store_true", help="create the bucket if it is missing")
    parser.add_argument("--events", type=Path, default=None, help="append JSON-lines progress events here")
    args = parser.parse_args(argv)
    for name in ("max_steps", "save_steps", "keep", "batch_size", "n_layer", "n_embd"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return Gpt2JobConfig(
        checkpoint_uri=args.checkpoint_uri,
        workdir=args.workdir,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        keep=args.keep,
        seed=args.seed,
        batch_size=args.batch_size,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        create_bucket=args.create_bucket,
        events_path=args.events,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = parse_args(argv)
        final = run(config)
    except SpotrayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"done: final checkpoint {final.name} is in {config.checkpoint_uri}")
    return 0
