"""The head-to-head's B leg (issue 74): the GPT-2 job of jobs/gpt2, written as a team would from Ray's
and KubeRay's documentation, with no spotray in it.

Ray Train's TorchTrainer runs the Hugging Face Trainer on each worker with Ray's
``RayTrainReportCallback`` (each HF checkpoint reported to Ray Train, which copies it to
``RunConfig.storage_path`` on S3) and ``prepare_trainer``; ``FailureConfig(max_failures=-1)`` restarts
a worker group that lost a worker, from the latest reported checkpoint (``ray.train.get_checkpoint()``);
a driver started again with the same ``RunConfig(name, storage_path)`` (a KubeRay RayJob's
``backoffLimit`` retry after a lost head) resumes from the run's latest checkpoint in storage. The
model, the bytes it trains on, the global batch, the seed and the checkpoint interval are
jobs/gpt2's; the data are the same corpus as an in-memory dataset, which is how Ray's HF example
feeds the Trainer.

Self-contained on purpose (a user's script): delivered to the head in a ConfigMap, as KubeRay's own
RayJob sample does (bench/head_to_head/real_pods.py writes it). S3 settings from the environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as the pods have them.

One part is the benchmark's, not the user's: ``--progress`` adds ``ProgressLog``, which writes each
worker group's (step, loss, time) to a small JSON object in the bucket every few seconds, so that the
benchmark reads B's steps the way it reads spotray's progress records. It costs a PUT every 5 s.

    python ray_documented.py --name b-leg --storage BUCKET/ray-results --max-steps 400 --every 25
"""

from __future__ import annotations

import argparse
import json
import os
import pydoc_data.topics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs
import ray.train
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

BLOCK = 128  # jobs/gpt2's block_size, byte-level vocabulary of 256


def corpus() -> list[dict[str, torch.Tensor]]:
    """The bytes of Python's own documentation, cut into blocks, as jobs/gpt2 writes its shards."""
    text = "".join(pydoc_data.topics.topics.values()).encode()
    blocks = torch.tensor(list(text[: len(text) // BLOCK * BLOCK]), dtype=torch.long).view(-1, BLOCK)
    return [{"input_ids": block, "labels": block} for block in blocks]


class StepFloor(TrainerCallback):
    """A step lasts at least ``seconds`` (the benchmark paces the tiny model like a real one, as A's
    ``--min-step-seconds`` does)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.began = time.monotonic()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        left = self.seconds - (time.monotonic() - self.began)
        if left > 0:
            time.sleep(left)


class ProgressLog(TrainerCallback):
    """The benchmark's instrument (rank 0): this worker group's start, the step it resumed from, and
    every step's (step, loss, time), written to ``STORAGE/NAME/bench-progress/GROUP.json``."""

    EVERY_S = 5.0

    def __init__(self, filesystem: pyarrow.fs.S3FileSystem, prefix: str) -> None:
        self.filesystem = filesystem
        self.key = f"{prefix}/bench-progress/{time.time():.3f}-{os.getpid()}.json"
        self.record: dict[str, Any] = {"started": time.time(), "resumed_from": None, "points": []}
        self.written = 0.0

    def _write(self) -> None:
        with self.filesystem.open_output_stream(self.key) as out:
            out.write(json.dumps(self.record).encode())
        self.written = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer loads a checkpoint's state before this: global_step is where it resumed.
        self.record["resumed_from"] = state.global_step or None
        if state.is_world_process_zero:
            self._write()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # The Trainer logs a step's loss after that step's on_step_end: it goes into the step's point.
        points = self.record["points"]
        if logs and "loss" in logs and points and points[-1][0] == state.global_step:
            points[-1][1] = float(logs["loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.record["points"].append([state.global_step, None, time.time()])
        if time.monotonic() - self.written >= self.EVERY_S:
            self._write()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._write()


def train_func(config: dict[str, Any]) -> None:
    torch.manual_seed(config["seed"])
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=256,
            n_positions=BLOCK,
            n_embd=128,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attn_pdrop=0.1,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    workers = ray.train.get_context().get_world_size()
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-"),
        max_steps=config["max_steps"],
        per_device_train_batch_size=config["batch_size"] // workers,
        # jobs/gpt2's optimizer schedule (spotray/jobs/gpt2/train.py), not the Trainer's defaults (linear,
        # no warm-up, no weight decay), which the first 30-minute run had: its final losses (1.34 for
        # spotray, 1.74 here) compared two different trainings.
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, config["max_steps"] // 20),
        weight_decay=0.01,
        save_strategy="steps",
        save_steps=config["every"],
        logging_steps=1,  # as jobs/gpt2's
        seed=config["seed"],
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=args, train_dataset=corpus())
    trainer.add_callback(RayTrainReportCallback())
    if config["min_step_seconds"]:
        trainer.add_callback(StepFloor(config["min_step_seconds"]))
    if config["progress"]:  # the driver's filesystem: a worker's environment may not name the endpoint
        trainer.add_callback(ProgressLog(config["filesystem"], config["progress"]))
    trainer = prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as directory:
        trainer.train(resume_from_checkpoint=str(Path(directory) / RayTrainReportCallback.CHECKPOINT_NAME))


def s3_filesystem() -> pyarrow.fs.S3FileSystem:
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    return pyarrow.fs.S3FileSystem(
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme or "http",
        region=os.environ.get("AWS_REGION", "us-east-1"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="the run's name in storage (the same on every retry)")
    parser.add_argument("--storage", required=True, help="BUCKET/PREFIX of Ray Train's storage_path")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=25, help="checkpoint every this many steps")
    parser.add_argument("--batch-size", type=int, default=16, help="global, as jobs/gpt2's")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-step-seconds", type=float, default=0.0)
    parser.add_argument("--progress", action="store_true", help="the benchmark's step log (ProgressLog)")
    args = parser.parse_args()
    filesystem = s3_filesystem()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={
            "max_steps": args.max_steps,
            "every": args.every,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "min_step_seconds": args.min_step_seconds,
            "progress": f"{args.storage}/{args.name}" if args.progress else "",
            "filesystem": filesystem,
        },
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=torch.cuda.is_available()),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage,
            storage_filesystem=filesystem,
            failure_config=FailureConfig(max_failures=-1),
            checkpoint_config=CheckpointConfig(num_to_keep=3),
        ),
    )
    result = trainer.fit()
    print(f"finished: {result.checkpoint}", flush=True)


if __name__ == "__main__":
    main()
