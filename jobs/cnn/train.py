"""Train a small CNN on generated images with Ray Train and Ray Data, checkpointing every epoch to S3.

    python -m spotray.jobs.cnn --checkpoint-uri s3://runs/cnn --data-uri s3://datasets/cnn-shapes --workers 2

Started by the controller or by ``spotray run --local``, the run's settings (checkpoint URI and
keep, data URI, workers) come from the TrainingRun in ``SPOTRAY_RUN`` and the flags above are not
needed; hyperparameters (epochs, batch size, learning rate) always come from the flags.

The driver checks the store, writes the dataset as Parquet if it is not there yet, and hands Ray
Train a Ray Data dataset over those files, which Ray Train splits into one equal shard per worker.
Each worker trains a plain PyTorch loop under DDP; at the end of every epoch rank 0 uploads model,
optimizer and epoch through the checkpoint core (manifest last) and prunes old checkpoints.

**This job resumes at epoch boundaries.** Ray Data has no data position to save mid-epoch, so a
worker killed in epoch N restarts from the checkpoint of epoch N-1 and trains epoch N again from
its start (the GPT-2 job, with MosaicML streaming, resumes at the exact sample instead). Each epoch
reads the data in a new random order, so a resumed run is not bit-identical to an uninterrupted
one; it trains the same number of epochs and steps.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs
import ray.data
import ray.train
import torch
import torch.distributed as dist
from ray.train.torch import prepare_model
from torch import nn

from spotray.contract.attempts import attempt_exit_code
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import RunContext, RunSpec
from spotray.contract.uris import parse_uri
from spotray.jobs.cnn.data import NUM_CLASSES, ShapesSpec, ensure_dataset
from spotray.jobs.common import (
    LoopConfig,
    add_run_flags,
    events_path,
    required_data_uri,
    run_context,
    worker_context,
)
from spotray.train.checkpoints.checkpoint import checkpoint_dir_name, prune_checkpoints, upload_checkpoint
from spotray.train.checkpoints.resume import (
    LoadCheck,
    ResumePoint,
    agree_on_resume_point,
    node_resume_dir,
    read_or_refuse,
)
from spotray.train.launch.batching import check_batch_splits
from spotray.train.launch.launcher import launch
from spotray.train.processes.ranks import world_rank, world_size
from spotray.train.records.event_log import EventLog
from spotray.train.storage.store import ObjectStore, StoreConfig, open_store

STATE_NAME = "state.pt"
# Enough to mix the classes within a shard without holding much of it in memory.
SHUFFLE_BUFFER = 512


@dataclass(frozen=True)
class CnnJobConfig(LoopConfig):
    """The job's own settings; the run's (checkpoint and data URIs, keep) are its RunContext."""

    workdir: Path
    num_samples: int
    image_size: int
    epochs: int = 5
    seed: int = 42
    batch_size: int = 64  # global: split across workers
    learning_rate: float = 2e-3
    events_path: Path | None = None


class SmallCnn(nn.Module):
    """Two conv blocks and a small classifier: about 40k parameters, seconds per epoch on a CPU."""

    def __init__(self, image_size: int, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * (image_size // 4) ** 2, 64), nn.ReLU(), nn.Linear(64, num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(images))
        return logits


def load_model(checkpoint_dir: str | Path) -> SmallCnn:
    """The trained model from a downloaded checkpoint directory."""
    state = torch.load(Path(checkpoint_dir) / STATE_NAME, weights_only=True)
    model = SmallCnn(int(state["image_size"]))
    model.load_state_dict(state["model"])
    return model


def arrow_filesystem(data_uri: str, config: StoreConfig) -> tuple[pyarrow.fs.FileSystem, str]:
    """The Arrow filesystem for ``data_uri`` (our S3 endpoint and keys) and the URI's root path in it."""
    uri = parse_uri(data_uri)
    if uri.scheme == "file":
        return pyarrow.fs.LocalFileSystem(), uri.prefix
    endpoint = urlparse(config.endpoint_url) if config.endpoint_url else None
    filesystem = pyarrow.fs.S3FileSystem(
        access_key=config.access_key_id,
        secret_key=config.secret_access_key,
        session_token=config.session_token,
        region=config.region,
        endpoint_override=endpoint.netloc if endpoint else None,
        scheme=endpoint.scheme if endpoint else "https",
    )
    return filesystem, f"{uri.bucket}/{uri.prefix}".rstrip("/")


def read_images(data_uri: str, files: list[str]) -> ray.data.Dataset:
    """The dataset's Parquet files as a Ray Data dataset (lazy: nothing is read until a worker iterates).

    Called inside the cluster (see ``main``), so the S3 keys come from that process's environment,
    as the workers' do, and never travel through Ray from the driver.
    """
    filesystem, root = arrow_filesystem(data_uri, StoreConfig.from_env())
    return ray.data.read_parquet([f"{root}/{name}" for name in files], filesystem=filesystem)


def save_checkpoint(store: ObjectStore, local_root: Path, state: dict[str, Any], keep: int) -> int:
    """Rank 0: ``state`` into ``checkpoint-<step>/``, uploaded manifest last, then prune; returns its bytes."""
    step = int(state["step"])
    local_dir = local_root / checkpoint_dir_name(step)
    local_dir.mkdir(parents=True, exist_ok=True)
    torch.save(state, local_dir / STATE_NAME)
    attempt = worker_context().attempt_id
    resume = {"epochs_done": int(state["epoch"]) + 1}
    manifest = upload_checkpoint(store, local_dir, step, world_size(), resume, attempt=attempt)
    prune_checkpoints(store, keep, attempt=attempt, just_uploaded=step)
    return manifest.total_bytes


@dataclass
class EpochTotals:
    """One rank's sums over an epoch, added up across ranks for the epoch's loss and accuracy."""

    loss_sum: float = 0.0
    correct: float = 0.0
    seen: float = 0.0
    steps: int = 0

    def all_ranks(self) -> EpochTotals:
        tensor = torch.tensor([self.loss_sum, self.correct, self.seen], dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(tensor)
        loss_sum, correct, seen = tensor.tolist()
        return EpochTotals(loss_sum, correct, seen, self.steps)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[dict[str, torch.Tensor]],
    image_size: int,
    on_step: Callable[[int, float], None],
) -> EpochTotals:
    """One pass over this rank's shard; ``on_step(steps so far in the epoch, loss)`` after each step."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    totals = EpochTotals()
    for batch in batches:
        images = batch["image"].view(-1, 1, image_size, image_size)
        labels = batch["label"]
        logits = model(images)
        loss = loss_fn(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        totals.loss_sum += loss.item() * len(labels)
        totals.correct += (logits.argmax(dim=1) == labels).sum().item()
        totals.seen += len(labels)
        totals.steps += 1
        on_step(totals.steps, loss.item())
    return totals


def state_check(image_size: int) -> LoadCheck:
    """Resume skips a checkpoint this job cannot load (train/checkpoints/resume.py): its state must fit the model."""

    def fits(point: ResumePoint) -> None:
        state: dict[str, Any] = torch.load(point.local_dir / STATE_NAME, map_location="cpu", weights_only=True)
        # load_state_dict refuses other names or shapes (RuntimeError); a scratch model: this one is cheap.
        SmallCnn(image_size).load_state_dict(state["model"])
        _ = state["optimizer"]["state"], int(point.manifest.resume["epochs_done"])

    return lambda point: read_or_refuse(STATE_NAME, partial(fits, point))


def restore(config: CnnJobConfig, resume_point: ResumePoint | None) -> tuple[nn.Module, torch.optim.Optimizer, int]:
    """The model (wrapped for DDP), its optimizer, and the epochs already done: from the checkpoint or fresh."""
    torch.manual_seed(config.seed)
    model = SmallCnn(config.image_size)
    state = torch.load(resume_point.local_dir / STATE_NAME, weights_only=True) if resume_point else None
    if state is not None:
        model.load_state_dict(state["model"])
    wrapped = prepare_model(model)  # DDP over gloo on CPU (NCCL on GPUs); a no-op for one worker
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=config.learning_rate)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    epochs_done = int(resume_point.manifest.resume["epochs_done"]) if resume_point else 0
    return wrapped, optimizer, epochs_done


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: resume at an epoch boundary, train epochs, checkpoint after each."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = CnnJobConfig.from_loop_config(loop_config)
    context = worker_context()
    rank, size = world_rank(), world_size()
    events = EventLog(config.events_path)
    events.emit("worker_start", rank=rank, world_size=size, pid=os.getpid())
    store = open_store(context.spec.checkpoint.uri)
    rank_dir = config.workdir / f"rank-{rank}"
    resume_point = agree_on_resume_point(
        store, node_resume_dir(config.workdir), context.attempt_id, state_check(config.image_size)
    )
    model, optimizer, start_epoch = restore(config, resume_point)
    unwrapped = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    per_worker = config.batch_size // size
    # Ray Train splits the dataset into equal shards and every rank drops its last partial batch,
    # so every rank takes the same number of steps per epoch (DDP needs that) and it is known here.
    steps_per_epoch = (config.num_samples // size) // per_worker
    step = resume_point.step if resume_point else 0
    max_steps = step + (config.epochs - start_epoch) * steps_per_epoch
    if rank == 0:
        events.emit(
            "start",
            pid=os.getpid(),
            attempt=context.attempt,  # kept by a restart of the workers inside it
            resumed_from=resume_point.step if resume_point else None,
            checkpoint_uri=context.spec.checkpoint.uri,
            max_steps=max_steps,
            world_size=size,
            epoch=start_epoch,
            epochs=config.epochs,
        )
    shard = ray.train.get_dataset_shard("train")
    metrics: dict[str, Any] = {"step": step}
    for epoch in range(start_epoch, config.epochs):

        def on_step(in_epoch: int, loss: float, epoch: int = epoch, first: int = step) -> None:
            if rank == 0:
                events.emit("step", step=first + in_epoch, loss=loss, max_steps=max_steps, epoch=epoch)

        batches = shard.iter_torch_batches(
            batch_size=per_worker, drop_last=True, local_shuffle_buffer_size=SHUFFLE_BUFFER
        )
        totals = train_epoch(model, optimizer, batches, config.image_size, on_step).all_ranks()
        step += totals.steps
        metrics = {
            "epoch": epoch,
            "step": step,
            "loss": totals.loss_sum / totals.seen,
            "accuracy": totals.correct / totals.seen,
        }
        if rank == 0:
            events.emit("epoch_end", **metrics)
            started = time.monotonic()
            state = {
                "model": unwrapped.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "step": step,
                "image_size": config.image_size,
            }
            size_bytes = save_checkpoint(store, rank_dir / "checkpoints", state, context.spec.checkpoint.keep)
            events.emit(
                "checkpoint_complete",
                step=step,
                epoch=epoch,
                uri=str(store.uri.join(checkpoint_dir_name(step))),
                bytes=size_bytes,
                upload_seconds=round(time.monotonic() - started, 3),
            )
    # Once, at the end: each report is a 2 s barrier across ranks (see train/hf/progress.py); live
    # progress is in the event log. Every rank reports, as Ray Train requires.
    ray.train.report({**metrics, "last_checkpoint_step": step})
    if rank == 0:
        events.emit(
            "end",
            step=step,
            final_uri=str(store.uri.join(checkpoint_dir_name(step))),
            load="spotray.jobs.cnn.train.load_model(DIR)",
        )


def build_job_config(args: argparse.Namespace, context: RunContext, data: ShapesSpec) -> CnnJobConfig:
    spec = context.spec
    required_data_uri(context, "spotray.jobs.cnn", "Parquet files", "s3://BUCKET/datasets/cnn-shapes")
    workers = spec.workers.num_workers
    check_batch_splits(args.batch_size, spec.workers)
    if data.num_samples // workers < args.batch_size // workers:
        raise SpotrayError(
            f"{data.num_samples} samples give each of {workers} workers less than one batch "
            f"of {args.batch_size // workers}",
            "lower --batch-size or raise --samples-per-class",
        )
    return CnnJobConfig(
        workdir=args.workdir / context.name,
        num_samples=data.num_samples,
        image_size=data.image_size,
        epochs=args.epochs,
        seed=args.seed,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        events_path=events_path(args),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spotray.jobs.cnn", description=__doc__.split("\n\n")[0])
    add_run_flags(
        parser,
        run_name="cnn",
        data_help="where the Parquet files are (generated there if missing)",
        checkpoints_every_steps=False,
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-cnn", help="local scratch directory"
    )
    parser.add_argument("--epochs", type=int, default=5, help="a checkpoint is taken after each")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size, split across workers")
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=42, help="model initialisation")
    parser.add_argument(
        "--samples-per-class", type=int, default=ShapesSpec.samples_per_class, help="images generated per class"
    )
    args = parser.parse_args(argv)
    for name in ("epochs", "keep", "batch_size", "workers", "samples_per_class"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def prepare(spec: RunSpec, data: ShapesSpec, *, create_bucket: bool) -> tuple[ObjectStore, list[str]]:
    """Fail fast on bad storage settings, and write the dataset if it is not in the store yet."""
    assert spec.data.uri is not None  # build_job_config checked
    store = open_store(spec.checkpoint.uri)
    store.check(create_bucket=create_bucket)
    data_store = open_store(spec.data.uri)
    data_store.check(create_bucket=create_bucket)
    info, written = ensure_dataset(data_store, data)
    if written:
        print(f"prepared the dataset: {data.num_samples} images as Parquet in {spec.data.uri}")
    return store, info.files


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    data = ShapesSpec(samples_per_class=args.samples_per_class)
    try:
        context = run_context(args)
        config = build_job_config(args, context, data)
        store, files = prepare(context.spec, data, create_bucket=args.create_bucket)
    except SpotrayError as error:
        # Bad input (2) ends the run; an infrastructure fault such as a store that does not answer
        # yet (75) is tried again, spending no budget (spotray/contract/errors.py).
        print(f"error: {error}", file=sys.stderr)
        return attempt_exit_code(error)
    # A factory, not a dataset: Ray Train calls it when each worker group starts, after launch()
    # has connected to the cluster. Building the dataset here would connect first, without the
    # runtime_env that carries SPOTRAY_RUN and the event log path to the workers.
    assert context.spec.data.uri is not None  # build_job_config checked
    datasets = {"train": partial(read_images, context.spec.data.uri, files)}
    return launch(
        train_loop,
        config.to_loop_config(),
        context,
        store,
        datasets=datasets,
        resume_dir=node_resume_dir(config.workdir),
    )
