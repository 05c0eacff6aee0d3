"""Train a small GPT-2 (built from config) with Ray Train, streaming MDS shards from S3, resumable at any moment.

    python -m spotray.jobs.gpt2 --checkpoint-uri s3://runs/gpt2 --data-uri s3://datasets/gpt2-bytes --workers 2

Started by the controller or by ``spotray run --local``, the run's settings (checkpoint URI and
interval, data URI, workers) come from the TrainingRun in ``SPOTRAY_RUN`` and the flags above are
not needed; hyperparameters (steps, batch size, model size) always come from the flags.

The same job runs without Ray under torchrun (detected from torchrun's environment), with the
same checkpoints, data position and SIGTERM handling:

    torchrun --nproc-per-node 2 -m spotray.jobs.gpt2 --checkpoint-uri ... --data-uri ...

The driver checks the store, prepares the dataset if it is not there yet, and starts one Ray Train
worker per slot. Each worker fetches the newest complete checkpoint (the same one on every rank),
continues at the exact next sample, and syncs every checkpoint to the store in the background.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from spotray.contract.attempts import attempt_exit_code
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import RunContext, RunSpec
from spotray.contract.uris import parse_uri
from spotray.jobs.common import (
    LoopConfig,
    add_run_flags,
    events_path,
    required_data_uri,
    run_context,
    worker_context,
)
from spotray.jobs.gpt2.data import MDS_COLUMNS, VOCAB_SIZE, ByteBlocks, corpus_bytes, mds_samples, to_features
from spotray.train.checkpoints.async_checkpoint import WHEN_BUSY_CHOICES, AsyncSaveTrainer
from spotray.train.checkpoints.resume import ResumeFetch, node_resume_dir
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.checkpoint_interval import AutoCheckpointInterval, run_history
from spotray.train.hf.data import (
    DataPosition,
    EpochLoader,
    SampleRecorder,
    StreamingTrainer,
    ensure_dataset,
    new_worker_group_id,
    open_streaming_dataset,
    release_after_training,
)
from spotray.train.hf.learning_rate import LearningRateAfterResume
from spotray.train.hf.loadable import trainer_checkpoint_check
from spotray.train.hf.worker import PreemptionNoticeCallback, ProgressCallback
from spotray.train.launch.batching import check_batch_splits, plan_batch
from spotray.train.launch.launcher import launch, outcome_after_fit
from spotray.train.processes.ranks import broadcast_from_rank0, destroy_process_group, world_rank, world_size
from spotray.train.records.events import EventLog
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter, continue_attempt_progress
from spotray.train.storage.store import ObjectStore, open_store

log = logging.getLogger("spotray.jobs.gpt2")


@dataclass(frozen=True)
class Gpt2JobConfig(LoopConfig):
    """The job's own settings; the run's (checkpoint and data URIs, interval, keep, GPUs) are its RunContext."""

    workdir: Path
    max_steps: int = 400
    seed: int = 42
    batch_size: int = 16  # global: split across workers, so a resume with another worker count trains the same
    block_size: int = 128
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    learning_rate: float = 3e-3
    dropout: float = 0.1
    create_bucket: bool = False
    events_path: Path | None = None
    async_checkpoints: bool = (
        True  # the loop waits only for a copy to host memory (train/checkpoints/async_checkpoint.py)
    )
    when_busy: str = "wait"  # a save while the previous one is still being written: "wait" or "skip"
    min_step_seconds: float = 0.0  # a step lasts at least this long (see StepFloor)


class StepFloor(TrainerCallback):
    """Make each step last at least ``seconds``, by sleeping (no CPU spent).

    A model small enough for a 2-core fault campaign trains a step in 10 ms, so a fault drawn for
    step 5 can only land once training is over; paced like a real model's steps, it lands near its
    step and the campaign samples every window of a run (bench/nemesis.py).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds, self.began = seconds, 0.0

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.began)))


def build_model(config: Gpt2JobConfig) -> GPT2LMHeadModel:
    model_config = GPT2Config(  # type: ignore[no-untyped-call]
        vocab_size=VOCAB_SIZE,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(model_config)  # type: ignore[no-untyped-call]


def build_training_args(
    config: Gpt2JobConfig,
    *,
    save_steps: int,
    use_gpu: bool = False,
    per_device_batch: int | None = None,
    accumulation: int = 1,
) -> TrainingArguments:
    """``save_steps`` 0: no save at a fixed interval (everySteps: auto decides, or none at all)."""
    return TrainingArguments(
        output_dir=str(config.workdir / "checkpoints"),
        max_steps=config.max_steps,
        per_device_train_batch_size=per_device_batch or config.batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, config.max_steps // 20),
        weight_decay=0.01,
        logging_steps=1,
        save_strategy="steps" if save_steps > 0 else "no",
        save_steps=save_steps if save_steps > 0 else 500,
        save_total_limit=2,  # local copies only; the store keeps `keep` of its own
        seed=config.seed,
        full_determinism=True,
        use_cpu=not use_gpu,
        dataloader_num_workers=0,
        ignore_data_skip=True,  # the data position in the checkpoint replaces skipping seen batches
        report_to=[],
        disable_tqdm=True,
    )


def build_trainer(config: Gpt2JobConfig, callbacks: list[TrainerCallback], *, save_steps: int) -> Trainer:
    """A single-process Trainer over the in-memory corpus: no Ray, no data store.

    The benchmarks of the checkpoint core and its tests use it to measure and fault the checkpoint
    path alone; the job itself trains through ``train_loop`` below. With ``async_checkpoints`` it
    is an ``AsyncSaveTrainer`` (asynchronous only with a callback made with ``async_save=True``).
    """
    set_seed(config.seed)
    trainer_class = AsyncSaveTrainer if config.async_checkpoints else Trainer
    trainer: Trainer = trainer_class(
        model=build_model(config),
        args=build_training_args(config, save_steps=save_steps),
        train_dataset=ByteBlocks(corpus_bytes(), config.block_size),
        callbacks=callbacks,
    )
    return trainer


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: resume, stream, train, sync."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = Gpt2JobConfig.from_loop_config(loop_config)
    started = time.time()  # this worker group is up: its nodes were there (the ledger's waiting ends here)
    rank, size = world_rank(), world_size()
    context = worker_context()
    spec = context.spec
    events = EventLog(config.events_path)
    events.emit("worker_start", rank=rank, world_size=size, pid=os.getpid())
    store = open_store(spec.checkpoint.uri)
    rank_dir = config.workdir / f"rank-{rank}"
    # The checkpoint downloads in the background while the model is built; a node keeps one copy.
    fetch = ResumeFetch(store, node_resume_dir(config.workdir), context.attempt_id)
    set_seed(config.seed)  # the initial weights of a fresh start
    model = build_model(config)
    resume_point = fetch.wait(trainer_checkpoint_check(model))  # an older one if the Trainer could not load it
    position = DataPosition.from_dict(resume_point.manifest.resume.get("data_position") if resume_point else None)
    start_step = resume_point.step if resume_point else 0
    cache_dir = config.workdir / "mds-cache"
    # The same global batch at any worker count (an elastic run shrinks and grows): train/launch/batching.py.
    plan = plan_batch(config.batch_size, size, spec.workers.num_workers)
    group = broadcast_from_rank0(new_worker_group_id())  # names this worker group in the sample log
    if rank == 0:
        events.emit(
            "start",
            pid=os.getpid(),
            attempt=context.attempt_id.attempt,  # a restart of the workers inside an attempt keeps its number
            resumed_from=resume_point.step if resume_point else None,
            checkpoint_uri=spec.checkpoint.uri,
            max_steps=config.max_steps,
            world_size=size,
            per_device_batch=plan.per_device,
            accumulation=plan.accumulation,
            data_position=position.to_dict(),
            dataset_cache=str(cache_dir),  # local mode releases its shared memory when it ends (spotray/reaper.py)
            resume_fetch_s=None if fetch.fetch_s is None else round(fetch.fetch_s, 3),
            resume_wait_s=None if fetch.waited_s is None else round(fetch.waited_s, 3),
        )
    assert spec.data.uri is not None  # the driver checked
    dataset = open_streaming_dataset(
        parse_uri(spec.data.uri),
        cache_dir,
        batch_size=plan.per_device,
        position=position,
        shuffle_seed=config.seed,
    )
    loader = EpochLoader(
        dataset,
        batch_size=plan.per_device,
        world_size=size,
        start=position,
        collate_fn=SampleRecorder(
            to_features,
            rank=rank,
            start_step=start_step,
            attempt=context.attempt,
            accumulation=plan.accumulation,
            group=group,
        ),
    )
    sync = S3CheckpointCallback(
        spec.checkpoint.uri,
        keep=spec.checkpoint.keep,
        store=store,
        events=events if rank == 0 else None,
        staging_dir=rank_dir / "staging",
        data_position=lambda: loader.position.to_dict(),  # noqa: PLW0108 (reads the position at save time)
        attempt=context.attempt_id,
        async_save=config.async_checkpoints,
        when_busy=config.when_busy,
    )
    progress = None
    if rank == 0:
        fresh = AttemptProgress(
            attempt=context.attempt,
            run_id=context.run_id,
            resumed_from=resume_point.step if resume_point else None,
            max_steps=config.max_steps,
            world_size=size,
            started=started,
        )
        progress = ProgressWriter(store, continue_attempt_progress(store, fresh))
    report = ProgressCallback(sync, events, progress)
    notice = PreemptionNoticeCallback(sync, events, attempt=context.attempt_id)
    # --learning-rate holds after a resume too (the Trainer would restore the checkpoint's): a sweep's
    # population-based training resumes a trial from another's checkpoint with a perturbed rate.
    callbacks: list[TrainerCallback] = [sync, report, notice, LearningRateAfterResume(config.learning_rate)]
    if config.min_step_seconds > 0:
        callbacks.append(StepFloor(config.min_step_seconds))
    if spec.checkpoint.auto_interval:
        history = run_history(store, progress.progress) if progress is not None else None
        callbacks.append(AutoCheckpointInterval(spec.checkpoint, sync, history, progress))
    trainer = StreamingTrainer(
        model=model,
        # One output dir for all ranks of a node: each rank writes its RNG state into the same checkpoint.
        args=build_training_args(
            config,
            save_steps=spec.checkpoint.fixed_every_steps or 0,  # 0: no fixed interval (everySteps: auto)
            use_gpu=spec.workers.gpu > 0,
            per_device_batch=plan.per_device,
            accumulation=plan.accumulation,
        ),
        callbacks=callbacks,
        epoch_loader=loader,
    )
    trainer.train(resume_from_checkpoint=str(resume_point.local_dir) if resume_point else None)
    release_after_training(cache_dir)
    step = trainer.state.global_step
    if rank == 0 and notice.stopped_at_step is None:
        events.emit(
            "end",
            step=step,
            final_uri=str(store.uri.join(f"checkpoint-{step}")),
            load="transformers.AutoModelForCausalLM.from_pretrained(DIR)",
        )


def build_job_config(args: argparse.Namespace, context: RunContext) -> Gpt2JobConfig:
    required_data_uri(context, "spotray.jobs.gpt2", "MDS shards", "s3://BUCKET/datasets/gpt2-bytes")
    check_batch_splits(args.batch_size, context.spec.workers)
    return Gpt2JobConfig(
        # Absolute: Ray Train workers run in a directory of Ray's, not the driver's.
        workdir=(args.workdir / context.name).absolute(),
        max_steps=args.max_steps,
        seed=args.seed,
        batch_size=args.batch_size,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        learning_rate=args.learning_rate,
        dropout=args.dropout,
        create_bucket=args.create_bucket,
        events_path=events_path(args),
        async_checkpoints=args.checkpoint_mode == "async",
        when_busy=args.when_busy,
        min_step_seconds=args.min_step_seconds,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spotray.jobs.gpt2", description=__doc__.split("\n\n")[0])
    add_run_flags(parser, run_name="gpt2", data_help="where the MDS shards are (prepared there if missing)")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-gpt2", help="local scratch directory"
    )
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch size, split across workers")
    parser.add_argument("--n-layer", type=int, default=2, help="transformer blocks")
    parser.add_argument("--n-embd", type=int, default=128, help="embedding width (a multiple of 4 heads)")
    parser.add_argument(
        "--learning-rate", type=float, default=Gpt2JobConfig.learning_rate, help="AdamW's peak learning rate"
    )
    parser.add_argument(
        "--dropout", type=float, default=0.1, help="0 makes runs with different worker counts numerically equal"
    )
    parser.add_argument(
        "--checkpoint-mode",
        choices=("async", "sync"),
        default="async",
        help="async: a save blocks training only for a copy to host memory; sync: the Trainer's own save",
    )
    parser.add_argument(
        "--when-busy",
        choices=WHEN_BUSY_CHOICES,
        default="wait",
        help="async: a save that comes while the previous one is still being written waits for it, or is skipped",
    )
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="make each step last at least this long (a fault campaign's tiny model paced like a real one)",
    )
    args = parser.parse_args(argv)
    if args.min_step_seconds < 0:
        parser.error("--min-step-seconds must be >= 0")
    if not args.learning_rate > 0:
        parser.error("--learning-rate must be > 0")
    for name in ("max_steps", "save_steps", "keep", "batch_size", "n_layer", "n_embd", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def prepare(config: Gpt2JobConfig, spec: RunSpec) -> ObjectStore:
    """Fail fast on bad storage settings, and write the dataset if it is not in the store yet."""
    store = open_store(spec.checkpoint.uri)
    store.check(create_bucket=config.create_bucket)
    assert spec.data.uri is not None
    data_store = open_store(spec.data.uri)
    data_store.check(create_bucket=config.create_bucket)
    if ensure_dataset(data_store, lambda: mds_samples(config.block_size), MDS_COLUMNS):
        print(f"prepared the dataset: MDS shards in {spec.data.uri}")
    return store


def run_under_torchrun(config: Gpt2JobConfig, context: RunContext) -> int:
    """One torchrun process: rank 0 prepares, every rank trains; the exit code as the Ray launcher gives it."""
    dist.init_process_group("nccl" if context.spec.workers.gpu > 0 else "gloo")
    try:
        store = prepare(config, context.spec) if dist.get_rank() == 0 else open_store(context.spec.checkpoint.uri)
        # Every rank made its own context; rank 0's identity is the run's, and train_loop reads it.
        context = dataclasses.replace(context, run_id=broadcast_from_rank0(context.run_id))
        os.environ.update(context.to_env())
        dist.barrier()
        train_loop(config.to_loop_config())
        return outcome_after_fit(store, context.attempt_id).exit_code
    finally:
        destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    torchrun_world = int(os.environ["WORLD_SIZE"]) if "TORCHELASTIC_RUN_ID" in os.environ else None
    try:
        context = run_context(args, workers=torchrun_world)
        config = build_job_config(args, context)
        if torchrun_world is not None:
            return run_under_torchrun(config, context)
        store = prepare(config, context.spec)
    except SpotrayError as error:
        # Bad input (2) ends the run; an infrastructure fault such as a store that does not answer
        # yet (75) is tried again, spending no budget (spotray/contract/errors.py).
        print(f"error: {error}", file=sys.stderr)
        return attempt_exit_code(error)
    return launch(train_loop, config.to_loop_config(), context, store, resume_dir=node_resume_dir(config.workdir))
