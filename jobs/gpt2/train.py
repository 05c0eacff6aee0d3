"""What each Ray Train worker of the GPT-2 job runs (jobs/gpt2/driver.py starts them): resume, stream, train, sync.

Each worker fetches the newest complete checkpoint (the same one on every rank) while it builds the
model, continues at the exact next sample, and syncs every checkpoint to the store in the
background. Only workers import this module (and with it transformers).
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from typing import Any

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from spotray.contract.uris import parse_uri
from spotray.jobs.common import (
    worker_context,
)
from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.data import VOCAB_SIZE, ByteBlocks, corpus_bytes, to_features
from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
from spotray.train.checkpoints.node_copies import NodeCopies, node_copies_dir
from spotray.train.checkpoints.resume import ResumeFetch, node_resume_dir
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.checkpoint_interval import AutoCheckpointInterval, run_history
from spotray.train.hf.data import (
    DataPosition,
    EpochLoader,
    SampleRecorder,
    StreamingTrainer,
    new_worker_group_id,
    open_streaming_dataset,
    release_after_training,
)
from spotray.train.hf.learning_rate import LearningRateAfterResume
from spotray.train.hf.loadable import trainer_checkpoint_check
from spotray.train.hf.notice import PreemptionNoticeCallback, in_ray_train
from spotray.train.hf.progress import ProgressCallback
from spotray.train.launch.batching import plan_batch
from spotray.train.launch.ray_capacity import run_worker_hosts, spare_room
from spotray.train.processes.ranks import broadcast_from_rank0, world_rank, world_size
from spotray.train.records.event_log import EventLog
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter, continue_attempt_progress
from spotray.train.storage.store import open_store

log = logging.getLogger("spotray.jobs.gpt2")


class StepFloor(TrainerCallback):
    """Make each step last at least ``seconds``, by sleeping (no CPU spent).

    A model small enough for a 2-core fault campaign trains a step in 10 ms, so a fault drawn for
    step 5 can only land once training is over; paced like a real model's steps, it lands near its
    step and the campaign samples every window of a run (bench/campaigns/nemesis.py).
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
    # The checkpoint downloads in the background while the model is built; a node keeps one copy. On
    # several nodes, what the nodes kept of their saves is read from them first (node_copies.py).
    copies = (
        NodeCopies(node_copies_dir(config.workdir), spec.checkpoint.node_copies)
        if spec.checkpoint.node_copies
        else None
    )
    fetch = ResumeFetch(store, node_resume_dir(config.workdir), context.attempt_id, copies)
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
            dataset_cache=str(
                cache_dir
            ),  # local mode releases its shared memory when it ends (spotray/local/reaper.py)
            resume_fetch_s=None if fetch.fetch_s is None else round(fetch.fetch_s, 3),
            resume_wait_s=None if fetch.waited_s is None else round(fetch.waited_s, 3),
            resume_read=fetch.read.to_dict() if fetch.read else None,  # several nodes: from S3, peers, kept copies
            skipped_checkpoints=fetch.skipped,  # newer complete checkpoints passed over, and why
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
        node_copies=copies,
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
            skipped_checkpoints=list(fetch.skipped),
            resume_read=fetch.read.to_dict() if fetch.read else None,
        )
        progress = ProgressWriter(store, continue_attempt_progress(store, fresh))
    # An elastic group goes on without the ranks a spot notice takes, if enough are left, and any group
    # whose spares Ray has room for right then (train/hf/notice.py). With spares, rank 0 also records
    # which worker pods are idle, so that the controller can move a spare off its worker's node.
    min_workers = spec.workers.min_workers if spec.workers.elastic else None
    room = partial(spare_room, spec.workers) if spec.workers.spare_replicas else None
    hosts = partial(run_worker_hosts, spec.workers) if spec.workers.spare_replicas and in_ray_train() else None
    report = ProgressCallback(sync, events, progress, worker_hosts=hosts)
    notice = PreemptionNoticeCallback(
        sync, events, attempt=context.attempt_id, min_workers=min_workers, spare_room=room
    )
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
