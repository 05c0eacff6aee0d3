"""The Hugging Face ``TrainerCallback`` that makes every checkpoint reach S3.

``on_save`` runs right after the Trainer wrote ``checkpoint-<step>/`` locally. The callback waits
for every rank to finish writing (each rank saves its own RNG state), then world process zero
hard-links the directory into a staging area and hands it to the background uploader. Training
continues at once. A failed upload is raised on the next step; ``on_train_end`` waits for the
last upload, so a run that ends normally has its final checkpoint in S3.

On several nodes, each with its own disk, the files are spread over the nodes: each node's local
process zero stages and uploads the files only its node holds, and world process zero writes the
one manifest once every node's part is in (train/checkpoints/node_parts.py).

With ``async_save=True`` and an ``AsyncSaveTrainer`` (train/checkpoints/async_checkpoint.py) the Trainer's
save only copies the state into host memory; ``on_save`` hands that snapshot to a background
writer, which writes the same files and then stages and submits them as above.

With ``node_copies`` on several nodes, each node also keeps the files it stages, and sends them to
the next node while they upload (train/checkpoints/node_copies.py): a resume reads from those copies
what the surviving nodes hold, and from S3 only the rest.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.contract.attempts import AttemptId
from spotray.contract.spec import CheckpointSpec, default_of
from spotray.train.checkpoints.async_checkpoint import SnapshotWriter
from spotray.train.checkpoints.checkpoint import Manifest, checkpoint_dir_name
from spotray.train.checkpoints.node_copies import (
    NodeCopies,
    PeerCopies,
    PeerRound,
    ShareRecord,
    copies_hold_the_save,
    peer_group,
)
from spotray.train.checkpoints.node_parts import NodeSave, plan_node_saves
from spotray.train.checkpoints.upload_worker import UploadStall
from spotray.train.checkpoints.uploader import CheckpointUploader, stage_checkpoint
from spotray.train.processes.ranks import all_gather_objects, world_rank
from spotray.train.records.event_log import EventLog
from spotray.train.storage.store import ObjectStore, open_store

# Without a TrainingRun (a plain Trainer script), the spec's default.
KEEP: int = default_of(CheckpointSpec, "keep")

log = logging.getLogger(__name__)


class S3CheckpointCallback(TrainerCallback):
    """Sync each checkpoint the Trainer saves to ``checkpoint_uri``, keeping the newest ``keep``.

    With ``save_final`` the last step is always checkpointed, even when ``max_steps`` is not a
    multiple of ``save_steps``, so the finished model is in the store too. ``data_position``, when
    given, returns where the data stream stands; it is recorded in the manifest for an exact resume.
    ``attempt``, when given, fences uploads and prunes: once a newer attempt has claimed the
    checkpoint URI (spotray/contract/attempts.py), this one raises instead of writing. ``async_save`` makes an
    ``AsyncSaveTrainer`` block only for a copy to host memory; ``when_busy`` says what a save does
    while the previous one is still being written from that memory ("wait" or "skip"). ``node_copies``
    keeps each node's files of the newest checkpoints on the node and on the next one (the same on
    every rank; used only on several nodes).
    """

    def __init__(
        self,
        checkpoint_uri: str,
        *,
        keep: int = KEEP,
        staging_dir: Path | None = None,
        store: ObjectStore | None = None,
        save_final: bool = True,
        events: EventLog | None = None,
        data_position: Callable[[], dict[str, Any]] | None = None,
        attempt: AttemptId | None = None,
        async_save: bool = False,
        when_busy: str = "wait",
        node_copies: NodeCopies | None = None,
    ) -> None:
        self.store = store or open_store(checkpoint_uri)
        self.snapshot_writer = SnapshotWriter(when_busy) if async_save else None
        self.data_position = data_position
        self.last_complete_step: int | None = None
        self.keep = keep
        self.save_final = save_final
        self.events = events or EventLog(None)
        self._staging_root = staging_dir
        self._owns_staging = staging_dir is None
        self._uploader: CheckpointUploader | None = None
        self.attempt = attempt
        self._step_ended_at = time.monotonic()
        self._last_stall: tuple[int, float] | None = None  # (step, seconds the loop waited for its save)
        self._skips_reported = 0
        # Set by the upload process's reports while uploads retry a store fault; rank 0's progress
        # callback writes it into the attempt's progress (train/hf/progress.py).
        self.upload_stall: UploadStall | None = None
        self.node_copies = node_copies
        self.peers: PeerCopies | None = None  # a node's first process, on several nodes with node_copies
        self._peer_round: PeerRound | None = None  # the newest save's turn in the ring
        self._peer_group_made = False

    def stall_at(self, step: int) -> float | None:
        """Seconds the training loop waited for the save of ``step``; None if this rank did not stage it."""
        return self._last_stall[1] if self._last_stall is not None and self._last_stall[0] == step else None

    def _get_uploader(self) -> CheckpointUploader:
        if self._uploader is None:
            self._uploader = CheckpointUploader(
                self.store,
                self.keep,
                on_uploaded=self._report_uploaded,
                attempt=self.attempt,
                on_abandoned=self._report_abandoned,
                on_stall=self._report_stall,
            )
        return self._uploader

    def _report_stall(self, stall: UploadStall | None) -> None:
        """A stall's start (the store's answer, since when) and its end, for the event log's readers."""
        self.upload_stall = stall
        if stall is None:
            self.events.emit("upload_flowing")
        else:
            self.events.emit("upload_stalled", since=stall.at, fault=stall.fault, action=stall.action)

    def _report_uploaded(self, manifest: Manifest, seconds: float) -> None:
        self.last_complete_step = manifest.step
        self.events.emit(
            "checkpoint_complete",
            step=manifest.step,
            uri=str(self.store.uri.join(checkpoint_dir_name(manifest.step))),
            bytes=manifest.total_bytes,
            upload_seconds=round(seconds, 3),
        )

    def _report_abandoned(self, step: int) -> None:
        total = self._get_uploader().dropped
        self.events.emit(
            "checkpoint_dropped", steps=[step], dropped_total=total, reason="another node dropped its part"
        )

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._staging_root is None:
            self._staging_root = Path(tempfile.mkdtemp(prefix="spotray-staging-"))
        if state.is_local_process_zero:
            self._get_uploader()  # starts the upload process while the first steps run (on every node)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._uploader is not None:
            self._uploader.raise_if_failed()
        if self.snapshot_writer is not None:
            self.snapshot_writer.raise_if_failed()
        if self.save_final and state.global_step >= state.max_steps > 0:
            control.should_save = True
        # The Trainer saves right after the step's callbacks: the stall is measured from here to staged.
        self._step_ended_at = time.monotonic()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        share = self._share_of_save(args, state, step)
        # Every node takes its turn in the ring for every save, with files or without.
        peer_round = self.peers.open_round(step) if self.peers is not None else None
        self._peer_round = peer_round
        if not state.is_world_process_zero:
            if share is not None:  # another node's local process zero: its files, then its part record
                source = Path(str(args.output_dir)) / checkpoint_dir_name(step)
                self._submit(source, step, args, {}, share=share, peer_round=peer_round)
            return
        samples_per_step = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
        resume = {
            "global_step": step,
            "epoch": state.epoch,
            "samples_seen": step * samples_per_step,
            "seed": args.seed,
        }
        if self.data_position is not None:
            resume["data_position"] = self.data_position()  # read now: the next step moves it
        writer = self.snapshot_writer
        snapshot = writer.pending if writer is not None else None
        timings: dict[str, float] = {}
        if writer is not None and snapshot is not None and snapshot.step == step:
            writer.pending = None
            submit = partial(self._submit, step=step, args=args, resume=resume, share=share, peer_round=peer_round)
            writer.write_in_background(snapshot, lambda written: submit(written.output_dir))
            timings["snapshot_s"] = round(snapshot.copy_s, 4)
        elif writer is not None and writer.skipped > self._skips_reported:
            self._skips_reported = writer.skipped
            self.events.emit("checkpoint_skipped", step=step, skipped=writer.skipped, reason="previous still writing")
            if peer_round is not None:
                PeerCopies.offer(peer_round, {})
            return
        else:
            source = Path(str(args.output_dir)) / checkpoint_dir_name(step)
            self._submit(source, step, args, resume, share=share, peer_round=peer_round)
        blocked_s = time.monotonic() - self._step_ended_at
        self._last_stall = (step, blocked_s)
        self.events.emit("checkpoint_saved", step=step, blocked_s=round(blocked_s, 4), **timings)

    def _share_of_save(self, args: TrainingArguments, state: TrainerState, step: int) -> NodeSave | None:
        """This process's share of the save of ``step`` when several nodes hold its files, else None.

        With several processes, every rank reports the files it finds in its node's checkpoint
        directory (its node's local process zero does) in one all_gather, which also waits until
        every rank has written its own files (rng_state_<rank>.pth, FSDP shards) before any is staged.
        """
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return None
        local_dir = Path(str(args.output_dir)) / checkpoint_dir_name(step)
        listing = None
        if state.is_local_process_zero:
            listing = sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob("*") if p.is_file())
        copies_at = (socket.gethostname(), str(self.node_copies.root.resolve())) if self.node_copies else None
        reports = all_gather_objects((listing, uuid.uuid4().hex, copies_at))
        shares = plan_node_saves([listing for listing, _, _ in reports], save_id=reports[0][1])
        share = shares[dist.get_rank()]
        if self.node_copies is not None and not self._peer_group_made and shares[0] is not None and shares[0].nodes > 1:
            leaders = tuple(rank for rank, found in enumerate(shares) if found is not None)
            self._start_peer_copies(leaders, share, [reports[rank][2] for rank in leaders])
        return share if share is not None and share.nodes > 1 else None

    def _start_peer_copies(self, leaders: tuple[int, ...], share: NodeSave | None, places: list[object]) -> None:
        """At the first save on several nodes: the nodes' first processes' group (every rank makes it)
        and, on each of them, the thread that copies its node's files to the next node. Not when two
        nodes keep their copies in one directory (local mode's Ray nodes share a machine): each holds
        the other's files already."""
        self._peer_group_made = True
        if len(set(map(repr, places))) < len(places):
            log.info("the nodes keep their checkpoints in one directory: no copies between them")
            return
        group = peer_group(leaders)
        if share is not None and self.node_copies is not None:
            self.peers = PeerCopies(self.node_copies, group, leaders, share.node)

    def _submit(
        self,
        source: Path,
        step: int,
        args: TrainingArguments,
        resume: dict[str, Any],
        *,
        share: NodeSave | None = None,
        peer_round: PeerRound | None = None,
    ) -> None:
        """Stage ``source`` and queue its upload; a checkpoint still waiting for its upload is dropped.
        With node copies, keep the staged files on the node and hand them to the ring's next round."""
        assert self._staging_root is not None
        names = share.files if share is not None and share.node > 0 else None
        staged = stage_checkpoint(source, self._staging_root / checkpoint_dir_name(step), names)
        if peer_round is not None:
            assert self.node_copies is not None
            assert share is not None
            uri = str(self.store.uri)
            record = ShareRecord(step, share.save_id, share.node, share.nodes, args.world_size, uri, resume=resume)
            PeerCopies.offer(peer_round, self.node_copies.keep_own(step, staged), record)
        dropped = self._get_uploader().submit(staged, step, args.world_size, resume, share)
        if dropped:
            total = self._get_uploader().dropped
            self.events.emit("checkpoint_dropped", steps=dropped, newer=step, dropped_total=total)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.snapshot_writer is not None:
            self.snapshot_writer.wait()  # the last snapshot is written and queued for upload
        if self._uploader is not None:
            self._uploader.close()  # waits for the last upload (raises if it failed), ends the upload process
            self._uploader = None
        if self.peers is not None:
            self.peers.close()  # the last checkpoint's copy is on the next node too
            self.peers = None
        if self._owns_staging and self._staging_root is not None:
            shutil.rmtree(self._staging_root, ignore_errors=True)
            self._staging_root = None

    def leave(self) -> None:
        """A notice stops the attempt: its last saves never take the URI from another run (``AttemptId.leaving``)."""
        if self.attempt is not None:
            self.attempt = replace(self.attempt, leaving=True)
        if self._uploader is not None:
            self._uploader.leave()

    def copies_hold(self, step: int, going: frozenset[int], timeout_s: float) -> bool:
        """Every rank (a collective): whether the save of ``step`` is whole on the nodes that stay when
        the ranks ``going`` go, in the copies the nodes keep, before its upload ends (within ``timeout_s``
        for the ring). If so, each node keeps the step until this process ends (``NodeCopies.pinned``),
        whatever newer saves come: it may be safe nowhere else yet, and the next start completes it in
        the store (train/checkpoints/complete_from_copies.py)."""
        if self.snapshot_writer is not None:
            self.snapshot_writer.wait()  # an async save offers its files to the ring once written
        ring_place, copied = None, False
        round_ = self._peer_round
        if self.peers is not None and round_ is not None and round_.step == step:
            ring_place, copied = self.peers.node, round_.done.wait(timeout_s) and round_.copied
        place = (socket.gethostname(), str(self.node_copies.root.resolve())) if self.node_copies else None
        reports = all_gather_objects((place, ring_place, copied, world_rank() in going))
        nodes: dict[object, tuple[int | None, bool, bool]] = {}
        for where, node, node_copied, rank_going in reports:
            if where is None:
                return False  # a rank that keeps no copies: its files are only in the store
            known = nodes.get(where, (None, False, False))
            nodes[where] = (
                node if node is not None else known[0], node_copied or known[1], rank_going or known[2]
            )  # fmt: skip
        held = copies_hold_the_save(list(nodes.values()))
        if held and self.node_copies is not None:
            self.node_copies.pinned.add(step)
        return held

    def flush(self) -> None:
        """Wait for the checkpoint being written and every queued upload; raises if one failed."""
        if self.snapshot_writer is not None:
            self.snapshot_writer.wait()
        if self._uploader is not None:
            self._uploader.flush()
