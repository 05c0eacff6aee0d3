"""Datasets as MosaicML MDS shards in S3, streamed into the Hugging Face Trainer with an exact data position.

Preparation (train/storage/mds_dataset.py) writes shards locally with ``MDSWriter`` and uploads them
through our store (retries, path-style addressing), ``index.json`` last: like a checkpoint manifest,
its presence means the dataset is complete, and a preparation cut short is redone, never read half-way.

Training reads with ``StreamingDataset`` (remote = the S3 prefix, a local cache on disk). Resume is
exact without skipping batches: the checkpoint records the data position (epoch, sample in epoch)
and the next attempt loads it with ``load_state_dict``. Streaming's sample order depends on
``num_canonical_nodes``, which we pin, not on how many workers there are, so a resume with a
different worker count continues the same global order: no sample twice, none skipped.

The known traps, handled here:
- the first iteration hanging on streaming's locks, or a new epoch's iterator blocking on a previous
  one that is still alive (mosaicml/streaming#307; seed 003 wrapped the dataloader in an endless
  loop to dodge it): ``EpochLoader`` keeps one iterator at a time, in the training process
  (``num_workers=0``, so no persistent loader workers hold the old epoch open), and starts the next
  epoch only after the previous one ran out;
- shared memory left in /dev/shm by a killed reader makes the next one fail ("Reused local
  directory"): local rank 0 releases what was registered for the cache directory before the dataset
  is built and after training (train/hf/streaming_memory.py says why not streaming's own cleanup);
- each rank must read its own partition: streaming partitions by RANK / WORLD_SIZE / LOCAL_WORLD_SIZE,
  which Ray Train's TorchTrainer sets; accelerate's own iterable sharding is bypassed (it would shard twice);
- a save on an epoch's last batch resumes where none of that epoch is left, and the Trainer stops at an
  epoch without a batch as if the data had ended (a run Succeeded at step 912 of 1800 on real pods):
  ``EpochLoader`` goes on with the next epoch, and refuses a dataset without one global batch per epoch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import TrainOutput

from spotray.contract.errors import SpotrayError
from spotray.contract.extras import extra_required
from spotray.contract.uris import StorageUri
from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
from spotray.train.hf.streaming_memory import release_streaming_memory
from spotray.train.processes.ranks import MachineRanks, launcher_local_ranks, machine_ranks

log = logging.getLogger(__name__)

# Pinned, not derived from the world size: the global sample order depends on it, so an attempt with
# fewer or more workers than the last one continues the same order. 1 works for every world size.
NUM_CANONICAL_NODES = 1


@dataclass(frozen=True)
class DataPosition:
    """Where the next global sample comes from: the epoch and how many samples of it were handed out."""

    epoch: int = 0
    sample_in_epoch: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> DataPosition:
        if not data:
            return cls()
        return cls(epoch=int(data["epoch"]), sample_in_epoch=int(data["sample_in_epoch"]))


def open_streaming_dataset(
    uri: StorageUri, cache_dir: Path, *, batch_size: int, position: DataPosition, shuffle_seed: int = 42
) -> Any:
    """A ``StreamingDataset`` over the MDS shards at ``uri``, set to continue at ``position``."""
    with extra_required("streaming"):
        from streaming import StreamingDataset  # noqa: PLC0415 (heavy import, only in training workers)

    machine = machine_ranks()
    on_each_node_once(lambda: release_streaming_memory(cache_dir), barrier_first=False, machine=machine)
    remote = str(uri) if uri.scheme == "s3" else uri.prefix
    with streaming_sees_machines(machine):
        dataset = StreamingDataset(
            remote=remote,
            local=str(cache_dir),
            batch_size=batch_size,
            shuffle=True,
            shuffle_seed=shuffle_seed,
            num_canonical_nodes=NUM_CANONICAL_NODES,
            download_retry=5,
        )
    if position != DataPosition():
        dataset.load_state_dict(
            {
                **position.to_dict(),
                "num_canonical_nodes": NUM_CANONICAL_NODES,
                "shuffle_seed": shuffle_seed,
                "initial_physical_nodes": None,
            }
        )
    return dataset


@contextlib.contextmanager
def streaming_sees_machines(machine: MachineRanks) -> Iterator[None]:
    """Streaming's nodes are machines: one local leader registers the shared memory of each /dev/shm.

    Where the launcher counts two nodes on one machine (local mode's elastic tests), both local
    leaders would register the same shared-memory name at once, and one fails (FileExistsError on
    ``/NNNNNN_locals``). So while the dataset is built, which is when streaming reads them,
    LOCAL_RANK and LOCAL_WORLD_SIZE count the ranks of the machine. A launcher with one node per
    machine (a pod, a cloud VM) is left as it is.
    """
    wanted = (machine.local_rank, machine.local_world_size)
    if not machine.uniform or wanted == launcher_local_ranks():
        yield
        return
    saved = {name: os.environ.get(name) for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = map(str, wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def release_after_training(cache_dir: Path) -> None:
    """After every rank's last step: release the cache directory's shared memory (a Ray worker is
    killed at the end, so streaming's own finalizers never run). All ranks call it."""
    on_each_node_once(lambda: release_streaming_memory(cache_dir), barrier_first=True, machine=machine_ranks())


def on_each_node_once(action: Callable[[], object], *, barrier_first: bool, machine: MachineRanks) -> None:
    """``action`` on the machine's first rank while its other ranks wait (all ranks call this)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and barrier_first:
        torch.distributed.barrier()
    if machine.local_rank == 0:
        action()
    if distributed and not barrier_first:
        torch.distributed.barrier()


class EpochLoader:
    """Batches from a streaming dataset, one epoch per ``iter()``, tracking the global data position.

    Every rank hands out the same number of batches per epoch (streaming pads partitions to equal
    length and we drop a last partial batch), so the global count is the local count times the world
    size. The position moves when a batch is handed to the Trainer, which with one batch per step
    and no prefetching workers means: the position after step N is exactly N global batches in.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        world_size: int,
        start: DataPosition,
        collate_fn: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    ) -> None:
        # A generator of its own: each iter() of a DataLoader draws a seed (for its workers, of which
        # there are none) from the one it has, by default torch's global RNG, so an epoch's start moved
        # the training's RNG (dropout) at each epoch boundary, and a resume from a save on an epoch's
        # last batch, whose RNG the checkpoint holds from before that boundary, drew other masks.
        self.loader: DataLoader[Any] = DataLoader(
            dataset,
            batch_size=batch_size,
            drop_last=True,
            num_workers=0,
            collate_fn=collate_fn,
            generator=torch.Generator(),
        )
        self.global_batch = batch_size * world_size
        self.position = start
        self._started = False

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        resumed = not self._started and self.position.sample_in_epoch > 0
        if self._started:  # the first iteration continues the resumed epoch; later ones start new epochs
            self.position = DataPosition(self.position.epoch + 1, 0)
        self._started = True
        handed = yield from self._epoch()
        if not handed and resumed:
            # Resumed from a save on the epoch's last batch: no full batch of it is left. The Trainer
            # takes an epoch without a batch for the end of the data and stops, so the run would end
            # Succeeded short of max_steps (the head-to-head's, at step 912 of 1800): go on with the next.
            self.position = DataPosition(self.position.epoch + 1, 0)
            handed = yield from self._epoch()
        if not handed:
            raise SpotrayError(
                f"epoch {self.position.epoch} of the dataset holds fewer samples than one global batch "
                f"({self.global_batch}: the batch size times the workers): no step can be trained",
                "use a larger dataset, or a smaller batch size",
            )

    def _epoch(self) -> Generator[dict[str, torch.Tensor], None, int]:
        """The batches of the dataset's next epoch, the position moved as each is handed out; returns how many."""
        handed = 0
        for batch in self.loader:
            self.position = DataPosition(self.position.epoch, self.position.sample_in_epoch + self.global_batch)
            handed += 1
            yield batch
        return handed


class StreamingTrainer(AsyncSaveTrainer):
    """A ``Trainer`` that takes its batches from an ``EpochLoader`` as they are.

    Its checkpoints are asynchronous when its ``S3CheckpointCallback`` says so (``AsyncSaveTrainer``).

    The stock Trainer wraps an iterable dataset in accelerate's sharding, which would split
    streaming's per-rank partitions again; and it skips already-seen batches on resume, which the
    data position makes unnecessary (run with ``ignore_data_skip=True``).

    Not skipping has a cost the Trainer does not make up for: it restores the checkpoint's RNG
    state (dropout masks, each rank's) only on the path that skips batches. So this class restores
    it at the first step after a resume, where the Trainer would have: without it a resumed run
    draws other dropout masks than an uninterrupted one and ends with other weights.
    """

    def __init__(self, *args: Any, epoch_loader: EpochLoader, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_loader = epoch_loader
        self._rng_checkpoint: str | None = None

    def get_train_dataloader(self) -> Any:
        return self.epoch_loader

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        self._rng_checkpoint = checkpoint
        finished = self._finished_state(checkpoint) if checkpoint is not None else None
        if checkpoint is not None and finished is not None:
            # Resumed from the final checkpoint (an attempt lost after it was complete): the Trainer
            # would still train one step, since it checks max_steps only after a step.
            self._load_from_checkpoint(checkpoint)
            self.state = finished
            log.info("resumed at step %d of %d: nothing left to train", finished.global_step, self.args.max_steps)
            return TrainOutput(finished.global_step, 0.0, {})
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _finished_state(self, checkpoint: str) -> TrainerState | None:
        """The checkpoint's trainer state when it is at or past max_steps; else None."""
        state_file = Path(checkpoint) / TRAINER_STATE_NAME
        if self.args.max_steps <= 0 or not state_file.exists():
            return None
        state = TrainerState.load_from_json(str(state_file))
        return state if state.global_step >= self.args.max_steps else None

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._rng_checkpoint is not None:
            self._load_rng_state(self._rng_checkpoint)  # type: ignore[no-untyped-call]
            self._rng_checkpoint = None
        loss: torch.Tensor = super().training_step(*args, **kwargs)
        return loss


class SampleRecorder:
    """The collate function: turns samples into tensors and can record which sample ids each rank trained on.

    Recording (for the no-duplicate, no-gap proof) is on when ``SPOTRAY_SAMPLE_LOG`` names a
    directory: each rank appends ``{"step": n, "rank": r, "t": unix time, "ids": [...], "group": g}``
    lines to its own file per attempt and start step, one line per forward pass (``accumulation``
    of them make a step). ``group`` names the worker group, the same on each of its ranks (rank 0
    chooses it), so that its lines are told from those of another group, of any size, that trained
    the same steps. ``trained_batches`` reads them back.
    """

    def __init__(
        self,
        to_features: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
        *,
        rank: int,
        start_step: int,
        attempt: int,
        accumulation: int = 1,
        group: str | None = None,
    ) -> None:
        self.to_features = to_features
        directory = os.environ.get("SPOTRAY_SAMPLE_LOG")
        self.path = Path(directory) / f"attempt-{attempt}-start-{start_step}-rank-{rank}.jsonl" if directory else None
        self.start_step = start_step
        self.passes = 0
        self.accumulation = accumulation
        self.rank = rank
        self.group = group or new_worker_group_id()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        self.passes += 1
        if self.path:
            step = self.start_step + (self.passes + self.accumulation - 1) // self.accumulation  # pass 1..a: step 1
            ids = [int(sample["sample_id"]) for sample in samples]
            with self.path.open("a") as handle:
                record = {"step": step, "rank": self.rank, "t": time.time(), "ids": ids, "group": self.group}
                handle.write(json.dumps(record) + "\n")
        features = [self.to_features(sample) for sample in samples]
        return {key: torch.stack([feature[key] for feature in features]) for key in features[0]}


def new_worker_group_id() -> str:
    return uuid.uuid4().hex[:12]


def trained_batches(sample_log: Path) -> dict[int, list[int]]:
    """Step -> the sample ids (every rank's, sorted) of the batch that counts for that step.

    A step trained more than once (a worker group or an attempt that resumed from an older
    checkpoint trains it again) counts as the worker group that trained it last: worker groups never
    overlap in time, so the newest is the one the final weights descend from, whatever its size. All
    of that group's passes of the step count, every rank's (gradient accumulation). A line cut off by
    a kill is skipped.
    """
    # step -> group -> (time of the group's first pass of the step, ids of all its passes)
    by_group: dict[int, dict[str, tuple[float, list[int]]]] = {}
    for path in sorted(sample_log.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            group = str(record["group"])
            groups = by_group.setdefault(int(record["step"]), {})
            first_t, ids = groups.setdefault(group, (float(record["t"]), []))
            groups[group] = (min(first_t, float(record["t"])), ids)
            ids.extend(int(i) for i in record["ids"])
    batches = {step: max(groups.values(), key=lambda entry: entry[0])[1] for step, groups in by_group.items()}
    return {step: sorted(ids) for step, ids in sorted(batches.items())}
