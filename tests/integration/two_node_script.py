"""Run by test_multi_node_checkpoint.py: one of two torchrun "nodes" on this machine, each with its own disk.

python -m torch.distributed.run --nnodes 2 --node-rank K --nproc-per-node 1 --master-addr 127.0.0.1 \
    --master-port P tests/integration/two_node_script.py NODE_DIR STORE_URI

STORE_URI is the object store both nodes reach (S3: AWS_* in the environment). Every local path is
under NODE_DIR, which is this node's alone, as a worker pod's disk is: the Trainer's checkpoints,
the staging area and the resume downloads. In the same processes, one after the other (a torchrun
start costs seconds), seeded trainings of a tiny GPT-2 with dropout on, so that every rank's RNG
state matters for an exact resume:

- whole: 6 steps uninterrupted (STORE_URI/whole);
- three ways of saving: the Trainer's own save (STORE_URI/shared-writer), the same with
  save_on_each_node (STORE_URI/each-node), and async saves (STORE_URI/async: node 0 writes its
  snapshot in the background, node 1 its RNG state at once). For each, an attempt stopped after
  the checkpoint at step 3, then a resume on both nodes from the store to step 6: read once between
  the two nodes (train/checkpoints/shared_read.py), but for save_on_each_node, where each node reads
  the whole checkpoint from the store;
- the Trainer's own save with node copies (train/checkpoints/node_copies.py): each node keeps its
  files and sends them to the other, and the resume reads nothing from the store (STORE_URI/kept);
  the same with node 0's copies gone before the resume, as when a new node replaces a lost one:
  node 1 holds every file (STORE_URI/kept-node-lost);
- the same, with checkpoint-3's upload cut short as well (its manifest, model and node parts gone from
  the store, as when the attempt died mid-upload): the resume completes checkpoint-3 in the store from
  what node 1 holds (its files and the records of both nodes' shares) and resumes from it, not from
  nothing (STORE_URI/kept-upload-lost).
"""

import shutil
import sys
from pathlib import Path

import torch.distributed as dist

from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME
from spotray.train.checkpoints.direct_load import DirectLoadTrainer
from spotray.train.checkpoints.node_copies import NodeCopies
from spotray.train.checkpoints.resume import ResumeFetch, fetch_resume_checkpoint
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.storage.store import ObjectStore, open_store
from tests.integration.test_async_checkpoint import StopAt, make_trainer


def train(node_dir: Path, store_uri: str, name: str, *, stop_at: int = 0, resume: bool = False) -> None:
    work = node_dir / name
    store = open_store(f"{store_uri}/{name}")
    async_save = name == "async"
    copies = NodeCopies(work / "copies") if name.startswith("kept") else None
    sync = S3CheckpointCallback(
        str(store.uri), store=store, keep=3, staging_dir=work / "staging", async_save=async_save, node_copies=copies
    )
    resume_from = None
    if resume:
        if name in ("kept-node-lost", "kept-upload-lost") and dist.get_rank() == 0:
            shutil.rmtree(work / "copies")
        if name == "kept-upload-lost" and dist.get_rank() == 0:
            cut_upload_short(store, 3)
        read_once, completed = name != "each-node", name == "kept-upload-lost"
        point = resume_point(store, work / "resume", read_once=read_once, copies=copies, completed=completed)
        resume_from = str(point)
    callbacks = [sync, StopAt(stop_at)] if stop_at else [sync]
    # DirectLoadTrainer (AsyncSaveTrainer is one) as the jobs use: the stock Trainer cannot resume a
    # CPU DDP run (it maps the optimizer state to "cpu:0", which torch.load refuses; train/checkpoints/direct_load.py).
    trainer_class = AsyncSaveTrainer if async_save else DirectLoadTrainer
    trainer = make_trainer(trainer_class, work, callbacks, save_on_each_node=name == "each-node")
    trainer.train(resume_from_checkpoint=resume_from)
    assert trainer.args.world_size == 2, "not a two-process run"
    if async_save and trainer.args.process_index == 0:
        assert sync.snapshot_writer is not None
        assert sync.snapshot_writer.buffers.nbytes > 0, "the Trainer saved synchronously"
    dist.barrier()  # both nodes finish (their uploads included) before the next training starts


def resume_point(
    store: ObjectStore, dest_root: Path, *, read_once: bool, copies: NodeCopies | None, completed: bool = False
) -> Path:
    """The local copy to resume from: read once for both nodes (each reads a share, the nodes exchange
    them: ``ResumeFetch``), or read whole by each node from the store; with ``copies``, read from
    what the nodes kept, nothing from the store."""
    if not read_once:
        point = fetch_resume_checkpoint(store, dest_root)
        assert point is not None, "no complete checkpoint to resume from"
        return point.local_dir
    fetch = ResumeFetch(store, dest_root, copies=copies)
    point = fetch.wait()
    assert point is not None, "no complete checkpoint to resume from"
    assert point.step == 3, f"resumed from checkpoint-{point.step}, not from the newest save (3)"
    assert point.manifest.signed == (store.checkpoint_key is not None)
    if dist.get_rank() == 0:
        assert fetch.read is not None, "the nodes did not read the checkpoint once between them"
        size = sum(entry.size for entry in point.manifest.files.values())
        read = (fetch.read.nodes, fetch.read.s3_bytes, fetch.read.peer_bytes, fetch.read.kept_bytes)
        assert read == ((2, 0, size, size) if copies else (2, size, size, 0)), fetch.read
        # Node 1 holds every file (node 0's copies are gone): it uploaded them all to complete checkpoint-3.
        assert fetch.read.completed_bytes == (size if completed else 0), fetch.read
    return point.local_dir


def cut_upload_short(store: ObjectStore, step: int) -> None:
    """What an attempt that died mid-upload leaves: some files of the checkpoint, no manifest, no parts."""
    prefix = f"checkpoint-{step}/"
    gone = [
        i.key for i in store.list(prefix) if i.key.endswith((MANIFEST_NAME, "model.safetensors")) or "/.parts/" in i.key
    ]
    assert len(gone) >= 3, gone
    store.delete(gone)
    assert [i.key for i in store.list(prefix) if i.key.endswith("optimizer.pt")], "nothing of the upload left"


if __name__ == "__main__":
    node_dir, store_uri = Path(sys.argv[1]), sys.argv[2]
    train(node_dir, store_uri, "whole")
    for name in ("shared-writer", "each-node", "async", "kept", "kept-node-lost", "kept-upload-lost"):
        train(node_dir, store_uri, name, stop_at=3)
        train(node_dir, store_uri, name, resume=True)
    destroy_process_group()  # before the interpreter: see ddp_checkpoint_script.py
