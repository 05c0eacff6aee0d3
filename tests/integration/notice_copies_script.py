"""Two torchrun "nodes" (one process each, their own directories), DDP over gloo, checkpoints in S3
through a slow upload link, node copies on: a spot notice to node 1 whose emergency checkpoint is safe
once the nodes' copies hold it, long before its upload ends (test_notice_node_copies.py).

python -m torch.distributed.run --nnodes 2 ... notice_copies_script.py NODE_DIR STORE_URI PHASE

- ``whole``: 12 steps, saves every 3, no notice: the weights an uninterrupted run ends with.
- ``notice``: the same run; its checkpoint-3 is waited for in the store (so that the link is free);
  at step 5 a notice names rank 1 (the run can go on without it: ``min_workers=1``, as an elastic
  run's or a run with a spare). The emergency checkpoint-5 is taken, and once it is safe rank 0 writes
  what it saw (where it was safe, whether the store had it yet, how long it took), then every process
  ends at once, uploads and all: node 1 went, and the group's restart took the other's processes
  with it (Ray Train restarts the whole group; the upload processes die with their parents).
- ``resume``: node 0 and a new, empty node 1 (the spare, or the node that came back) resume and
  train to step 12. The resume must complete checkpoint-5 in the store from node 0's copies (its own
  share and node 1's, sent over the ring before the notice's save was counted safe) and start there.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from bench.micro.notice_copies_node import NoticeAt
from spotray.train.checkpoints.checkpoint import checkpoint_dir_name, manifest_exists
from spotray.train.checkpoints.direct_load import DirectLoadTrainer
from spotray.train.checkpoints.node_copies import NodeCopies
from spotray.train.checkpoints.resume import ResumeFetch
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.notice import PreemptionNoticeCallback
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.records.event_log import EventLog, read_events
from spotray.train.storage.store import open_store
from tests.integration.test_async_checkpoint import make_trainer

NOTICE_AT, MAX_STEPS = 5, 12


class WaitForTheStore(TrainerCallback):
    """checkpoint-3 complete in the store before step 4: the slow link is free for the emergency one."""

    def __init__(self, sync: S3CheckpointCallback) -> None:
        self.sync = sync

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 3:
            self.sync.flush()
            dist.barrier()


class GoneOnceSafe(TrainerCallback):
    """After the emergency checkpoint is safe: say what was seen, then end every process at once."""

    def __init__(self, sync: S3CheckpointCallback, events: Path, out: Path) -> None:
        self.sync, self.events, self.out = sync, events, out

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step != NOTICE_AT:
            return
        if state.is_world_process_zero:
            emergency = [e for e in read_events(self.events) if e["event"] == "emergency_checkpoint"]
            seen = {
                "emergency": emergency,
                "in_store_when_safe": manifest_exists(self.sync.store, checkpoint_dir_name(NOTICE_AT)),
            }
            self.out.write_text(json.dumps(seen))
        dist.barrier()
        os._exit(0)  # no clean-up, no upload finished: the node is gone, the group torn down


def train(node_dir: Path, store_uri: str, phase: str) -> None:
    store = open_store(store_uri)
    copies = NodeCopies(node_dir / "copies")
    sync = S3CheckpointCallback(
        str(store.uri), store=store, keep=3, staging_dir=node_dir / "staging", node_copies=copies
    )
    callbacks: list[TrainerCallback] = [sync]
    resume_from = None
    if phase == "notice":
        events = node_dir / "events.jsonl"
        notice = PreemptionNoticeCallback(
            sync, EventLog(events), target_interval_s=0.0, notice=NoticeAt(NOTICE_AT, ranks=[1]), min_workers=1,
            node_id=lambda: None,
        )  # fmt: skip
        callbacks += [WaitForTheStore(sync), notice, GoneOnceSafe(sync, events, node_dir / "notice.json")]
    elif phase == "resume":
        fetch = ResumeFetch(store, node_dir / "resume", copies=copies)
        point = fetch.wait()
        assert point is not None, "no complete checkpoint to resume from"
        resume_from = str(point.local_dir)
        if dist.get_rank() == 0:
            read = fetch.read.to_dict() if fetch.read else None
            (node_dir / "resume.json").write_text(json.dumps({"step": point.step, "read": read}))
    trainer = make_trainer(DirectLoadTrainer, node_dir, callbacks, max_steps=MAX_STEPS)
    trainer.train(resume_from_checkpoint=resume_from)
    dist.barrier()


if __name__ == "__main__":
    dist.init_process_group("gloo")  # before the resume, which runs before the Trainer would make it
    train(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    destroy_process_group()  # before the interpreter: see ddp_checkpoint_script.py
