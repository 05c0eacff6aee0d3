"""Fine-tune your own pretrained causal LM, whole or with LoRA, resumable from S3 like the demo.

    python -m spotray.jobs.finetune --pretrained ./my-model --checkpoint-uri s3://BUCKET/runs/ft
    python -m spotray.jobs.finetune --pretrained ./my-model --lora-rank 8 --checkpoint-uri ...  # needs peft

``--pretrained`` is any directory ``AutoModelForCausalLM.from_pretrained`` loads (a model you saved,
or a Hugging Face hub snapshot you downloaded ahead, e.g. baked into the image or on the shared
volume). ``--make-pretrained`` writes a small GPT-2 there first, from config, as a stand-in: nothing
is downloaded, here or in the tests.

With ``--lora-rank`` the base weights stay frozen and only LoRA adapters train (PEFT's
``get_peft_model``); the Trainer then checkpoints the adapters alone (``adapter_model.safetensors``,
a fraction of the model), and the resume check loads them into the same adapter-wrapped model. A
resumed run ends with the weights of an uninterrupted one (tests/integration/test_finetune.py).

``--tensorboard`` logs to TensorBoard (``WORKDIR/tensorboard``) as one run across attempts: the
event files go next to the checkpoints at each save and come back at the next attempt's start
(``TensorBoardSync``).

Plain python or torchrun, the same calls as the README's own script: the checkpoint callback syncs
every save to S3, the newest complete checkpoint that this model can load is fetched at start, and
on SIGTERM (a spot notice) the run saves at once and stops when that checkpoint is safe. The data
are the bytes of Python's own documentation, cut into blocks (byte-level, vocabulary 256); a real
fine-tune brings its tokenizer and dataset in their place.
"""

from __future__ import annotations

import argparse
import pydoc_data.topics
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, TrainingArguments, set_seed

from spotray import (
    AsyncSaveTrainer,
    PreemptionNoticeCallback,
    S3CheckpointCallback,
    TensorBoardSync,
    fetch_resume_checkpoint,
    open_store,
    trainer_checkpoint_check,
)
from spotray.contract.errors import SpotrayError

BLOCK = 64


def make_pretrained(directory: Path, seed: int = 0) -> None:
    """A small GPT-2 saved as a pretrained model would be (config.json, model.safetensors)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=256, n_positions=BLOCK, n_embd=64, n_layer=2, n_head=2)  # type: ignore[no-untyped-call]
    GPT2LMHeadModel(config).save_pretrained(directory)  # type: ignore[no-untyped-call]


def load_model(pretrained: Path, lora_rank: int) -> Any:
    """The pretrained model, whole, or frozen under LoRA adapters of ``lora_rank`` on its attention."""
    model = AutoModelForCausalLM.from_pretrained(pretrained)
    if not lora_rank:
        return model
    try:
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415 - only LoRA runs need peft
    except ImportError:
        raise SpotrayError("--lora-rank needs PEFT, which is not installed", "pip install peft") from None
    # GPT-2's attention projection is a Conv1D: its weight is stored transposed (fan_in_fan_out).
    lora = LoraConfig(
        r=lora_rank, lora_alpha=2 * lora_rank, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lora)


def documentation_blocks(limit_bytes: int) -> list[dict[str, torch.Tensor]]:
    text = "".join(pydoc_data.topics.topics.values()).encode()[:limit_bytes]
    blocks = torch.tensor(list(text[: len(text) // BLOCK * BLOCK])).view(-1, BLOCK)
    return [{"input_ids": block, "labels": block} for block in blocks]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint-uri", required=True, help="s3://BUCKET/PREFIX or file:///shared/dir")
    parser.add_argument("--pretrained", type=Path, required=True, help="a directory from_pretrained loads")
    parser.add_argument("--make-pretrained", action="store_true", help="write a small GPT-2 there first")
    parser.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank (0: every weight)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--data-bytes", type=int, default=100_000, help="how much of the documentation to train on")
    parser.add_argument("--workdir", type=Path, default=Path("finetune-run"), help="local staging and resume files")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--tensorboard", action="store_true", help="log to TensorBoard, one run across attempts (WORKDIR/tensorboard)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, extra_callbacks: list[Any] | None = None) -> int:
    """``extra_callbacks``: more Trainer callbacks (the tests stop a run after a checkpoint with one)."""
    args = parse_args(argv)
    if args.make_pretrained and not (args.pretrained / "config.json").exists():
        make_pretrained(args.pretrained)
    store = open_store(args.checkpoint_uri)  # endpoint and keys from the environment
    store.check()
    set_seed(args.seed)  # LoRA's adapters start random: the same seed, the same start
    model = load_model(args.pretrained, args.lora_rank)
    # The newest complete checkpoint that verifies and that this model (adapters too) can load.
    resume = fetch_resume_checkpoint(store, args.workdir / "resume", trainer_checkpoint_check(model))
    print(f"resuming from step {resume.step}" if resume else "fresh start", flush=True)
    training_args = TrainingArguments(
        output_dir=str(args.workdir / "checkpoints"),
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        per_device_train_batch_size=8,
        learning_rate=args.learning_rate,
        logging_steps=10,
        seed=args.seed,
        report_to=["tensorboard"] if args.tensorboard else [],
        logging_dir=str(args.workdir / "tensorboard"),
    )
    sync = S3CheckpointCallback(args.checkpoint_uri, keep=3, store=store, async_save=True)
    callbacks = [sync, PreemptionNoticeCallback(sync), *(extra_callbacks or [])]
    if args.tensorboard:
        # The earlier attempts' event files come back into logging_dir, and each save keeps this one's.
        callbacks.append(TensorBoardSync(store, args.workdir / "tensorboard"))
    trainer = AsyncSaveTrainer(
        model=model, args=training_args, train_dataset=documentation_blocks(args.data_bytes), callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=str(resume.local_dir) if resume else None)
    print(f"trained to step {trainer.state.global_step}", flush=True)
    return 0
