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

The driver never imports transformers or the model's code: on every attempt it starts before the
workers can, and its imports are start-up time (issue 39). What each worker runs is
jobs/gpt2/train.py, imported there by ``train_loop`` below.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import torch.distributed as dist

from spotray.contract.attempts import attempt_exit_code
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import RunContext, RunSpec
from spotray.jobs.common import run_context
from spotray.jobs.gpt2.config import Gpt2JobConfig, build_job_config, parse_args
from spotray.jobs.gpt2.data import MDS_COLUMNS, mds_samples
from spotray.train.checkpoints.resume import node_resume_dir
from spotray.train.launch.launcher import launch, outcome_after_fit
from spotray.train.processes.ranks import broadcast_from_rank0, destroy_process_group
from spotray.train.storage.mds_dataset import ensure_dataset
from spotray.train.storage.store import ObjectStore, open_store


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs (jobs/gpt2/train.py). Ray ships this function by reference, so a
    worker imports the heavy module, and the driver, which only hands it over, never does."""
    from spotray.jobs.gpt2.train import train_loop as worker_loop  # noqa: PLC0415 - see the docstring

    worker_loop(loop_config)


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
