"""One torchrun "node" of bench/micro/notice_copies.py: a GPT-2 whose model carries a large buffer,
DDP over gloo with one process per node, each node its own directory, the HF Trainer with spotray's
callbacks, checkpoints in S3 through the node's slow link.

    notice_copies_node.py LEG PHASE NODE_DIR STORE_URI SIZE_MB OUT

PHASE ``notice``: saves at step 3 (waited for in the store: the link is then free) and a notice at step 6
naming rank 0 (node 0, which holds the model: the worst case), which the run can go on without (an
elastic run's minimum of one). Rank 0 writes OUT as soon as the emergency checkpoint is safe, then
every process ends at once: the node went, the group was torn down. If that takes longer than the
notice, the bench ends the processes at the notice's end itself. LEG ``copies`` keeps node copies
(spec.checkpoint.nodeCopies 1), ``store`` none (nodeCopies 0: the notice waits for the store).

PHASE ``resume``: the nodes (node 0's directory empty: a new node took its place) resume from the newest
checkpoint they can (``ResumeFetch``, completing one from the copies where they hold it) and train one
step; rank 0 writes OUT: the step resumed from, where the bytes came from, and when the first step ended.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

from spotray.train.checkpoints.direct_load import DirectLoadTrainer
from spotray.train.checkpoints.node_copies import NodeCopies
from spotray.train.checkpoints.resume import ResumeFetch
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.notice import PreemptionNoticeCallback
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.records.event_log import EventLog, read_events
from spotray.train.storage.store import open_store

SAVE_AT, NOTICE_AT, VOCAB, BLOCK = 3, 6, 64, 16


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.blocks = torch.randint(0, VOCAB, (512, BLOCK), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def big_gpt2(size_mb: int) -> GPT2LMHeadModel:
    """A tiny GPT-2 with a persistent buffer of ``size_mb`` MB: a checkpoint of real size, 2 CPU cores' steps."""
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2))  # type: ignore[no-untyped-call]
    ballast = torch.empty(size_mb * 1_000_000, dtype=torch.uint8)
    ballast.random_(generator=torch.Generator().manual_seed(1))
    model.register_buffer("ballast", ballast, persistent=True)
    return model


class NoticeAt:
    """The notice Ray Train gives when the node of ``ranks`` is drained (``get_preemption_info``): none before
    the ``step``-th question (asked once a step here), then one naming them, until the process ends.
    Injected: torchrun has no drain."""

    def __init__(self, step: int, ranks: list[int]) -> None:
        self.step, self.ranks, self.calls = step, ranks, 0

    def __call__(self) -> object | None:
        self.calls += 1
        return SimpleNamespace(preempted_ranks=self.ranks, deadline_ms=None) if self.calls >= self.step else None


class Phases(TrainerCallback):
    """The periodic save waited for in the store; after the emergency one is safe, report and end at once;
    in the resume, the first step's end."""

    def __init__(self, sync: S3CheckpointCallback, events: Path, out: Path, phase: str) -> None:
        self.sync, self.events, self.out, self.phase = sync, events, out, phase

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.phase != "notice":
            return
        if state.global_step == SAVE_AT:
            self.sync.flush()
            dist.barrier()
        elif state.global_step == NOTICE_AT:
            if state.is_world_process_zero:
                logged = list(read_events(self.events))
                self.out.write_text(json.dumps({"safe_at": time.time(), "events": logged}))
            dist.barrier()
            os._exit(0)  # no clean-up, no upload finished: the node is gone, the group torn down

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.phase == "resume":
            control.should_training_stop = True
            if state.is_world_process_zero:
                self.first_step_at = time.time()


def record_ring(sync: S3CheckpointCallback, path: Path) -> None:
    """Every half second, the bytes this node's ring has sent and received (bench instrumentation: where
    the notice's time goes), to ``path`` outside the node's directory, which a lost node takes with it."""

    def poll() -> None:
        with path.open("a") as handle:
            while True:
                peers = sync.peers
                if peers is not None:
                    handle.write(json.dumps([time.time(), peers.sent_bytes, peers.received_bytes]) + "\n")
                    handle.flush()
                time.sleep(0.5)

    threading.Thread(target=poll, name="bench-ring-progress", daemon=True).start()


def main(leg: str, phase: str, node_dir: Path, store_uri: str, size_mb: int, out: Path) -> None:
    dist.init_process_group("gloo")
    started = time.time()
    store = open_store(store_uri)
    copies = NodeCopies(node_dir / "copies") if leg == "copies" else None
    events = node_dir / "events.jsonl"
    log = EventLog(events)
    sync = S3CheckpointCallback(
        str(store.uri), store=store, keep=3, staging_dir=node_dir / "staging", node_copies=copies, events=log
    )
    if phase == "notice" and copies is not None:
        record_ring(sync, out.parent / f"ring-{node_dir.name}.jsonl")
    phases = Phases(sync, events, out, phase)
    callbacks: list[TrainerCallback] = [sync]
    resume_from, resumed = None, {}
    if phase == "notice":
        notice = NoticeAt(NOTICE_AT, ranks=[0])
        noticed = PreemptionNoticeCallback(
            sync, log, target_interval_s=0.0, notice=notice, min_workers=1, node_id=lambda: None
        )
        callbacks.append(noticed)
    else:
        fetch = ResumeFetch(store, node_dir / "resume", copies=copies)
        point = fetch.wait()
        resume_from = str(point.local_dir) if point is not None else None
        resumed = {"step": point.step if point is not None else 0, "read": fetch.read.to_dict() if fetch.read else None}
    callbacks.append(phases)
    set_seed(7)
    args = TrainingArguments(
        output_dir=str(node_dir / "checkpoints"), max_steps=NOTICE_AT + 3, per_device_train_batch_size=4,
        save_strategy="steps", save_steps=SAVE_AT, save_total_limit=2, logging_steps=1, seed=7, use_cpu=True,
        report_to=[], disable_tqdm=True, ddp_broadcast_buffers=False,
    )  # fmt: skip
    trainer = DirectLoadTrainer(model=big_gpt2(size_mb), args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume_from)
    if phase == "resume" and dist.get_rank() == 0:
        out.write_text(json.dumps({"started": started, "first_step_at": phases.first_step_at, **resumed}))
    dist.barrier()


if __name__ == "__main__":
    leg, phase, node_dir, store_uri, size_mb, out = sys.argv[1:7]
    main(leg, phase, Path(node_dir), store_uri, int(size_mb), Path(out))
    destroy_process_group()
