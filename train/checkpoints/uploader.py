"""Background checkpoint upload: stage, upload off the training loop, prune, and never fail silently.

The training loop pays only for ``stage_checkpoint`` (hard links, milliseconds). Hashing, uploading
and pruning run one checkpoint at a time, in order, in a separate process (see
``train/checkpoints/upload_worker.py`` for why a process). A thread in the training process coordinates: it
hands each checkpoint to that process and waits for the answer.

A failed upload is kept and raised on the trainer's next call into the uploader
(``raise_if_failed``, ``submit`` or ``flush``), so training can never go on believing a checkpoint
is safe when it is not.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import CheckpointAbandonedError, CheckpointUploadError
from spotray.train.checkpoints.checkpoint import Manifest, link_or_copy
from spotray.train.checkpoints.node_parts import NodeSave
from spotray.train.checkpoints.upload_worker import UploadJob, UploadStall, UploadWorker
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)


def _clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_s))


def stage_checkpoint(source: Path, staging: Path, names: Sequence[str] | None = None) -> Path:
    """Hard-link (or copy, across filesystems) ``source``, or only its files ``names``, into ``staging``.

    The trainer may rotate (delete) its local checkpoints while an upload is running; the staged
    links keep the files alive until the upload is done.
    """
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    paths = sorted(source.rglob("*")) if names is None else [source / name for name in names]
    for path in paths:
        target = staging / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            link_or_copy(path, target)
    return staging


def newest_wins(waiting: Sequence[UploadJob]) -> tuple[list[UploadJob], list[UploadJob]]:
    """Split the jobs still waiting when a newer checkpoint comes: (notices to queue again, dropped).

    Every waiting upload is dropped. Another node's part is not simply dropped: a notice that it
    was takes its place, since node 0 would otherwise wait for that part; notices cost one small
    write and are never dropped themselves.
    """
    notices: list[UploadJob] = []
    dropped: list[UploadJob] = []
    for job in waiting:
        if job.share is not None and job.share.dropped:
            notices.append(job)
            continue
        dropped.append(job)
        if job.share is not None and not job.commits:
            notices.append(replace(job, share=replace(job.share, dropped=True)))
    return notices, dropped


class CheckpointUploader:
    """Uploads staged checkpoint directories to ``store`` in order, then prunes to ``keep``."""

    def __init__(
        self,
        store: ObjectStore,
        keep: int,
        on_uploaded: Callable[[Manifest, float], None] | None = None,
        attempt: AttemptId | None = None,
        on_abandoned: Callable[[int], None] | None = None,
        *,
        on_stall: Callable[[UploadStall | None], None] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.store = store
        self.keep = keep
        self.attempt = attempt  # fences every upload and prune (spotray/contract/attempts.py)
        self._on_uploaded = on_uploaded
        self._on_abandoned = on_abandoned
        self._jobs: queue.Queue[UploadJob | None] = queue.Queue()
        self._failure: BaseException | None = None
        self._failed_step: int | None = None
        self.last_uploaded_step: int | None = None
        self.dropped = 0  # checkpoints dropped unuploaded because a newer one came (see submit)
        # Since when uploads stall on a fault the store keeps answering (the first of them), and its
        # latest words; None while uploads flow. ``on_stall`` hears when one begins and when it ends (None).
        self.stall: UploadStall | None = None
        self._on_stall = on_stall
        self._worker = UploadWorker(on_stall=self._stalled)
        self._worker.start()
        self._thread = threading.Thread(target=self._run, name="spotray-checkpoint-upload", daemon=True)
        self._thread.start()

    def leave(self) -> None:
        """The attempt is on its way out (a notice stops it): what it uploads from now on never takes
        the URI from another run (``AttemptId.leaving``)."""
        if self.attempt is not None:
            self.attempt = replace(self.attempt, leaving=True)

    def submit(
        self,
        staged_dir: Path,
        step: int,
        world_size: int,
        resume: dict[str, Any] | None = None,
        share: NodeSave | None = None,
    ) -> list[int]:
        """Queue a staged checkpoint; the uploader owns ``staged_dir`` from now on and deletes it.

        The newest checkpoint wins: one still waiting for its upload (not started) is dropped, its
        staged files deleted, so staging holds at most the one uploading and the one waiting.
        ``share`` is this node's share of a checkpoint several nodes save (train/checkpoints/node_parts.py).
        Returns the steps dropped.
        """
        self.raise_if_failed()
        dropped = self._drop_waiting()
        if dropped:
            self.dropped += len(dropped)
            steps = ", checkpoint-".join(map(str, dropped))
            stall = self.stall
            if stall is not None:
                log.warning(
                    "checkpoint uploads stalled since %s: the store answers %s (retried); dropped checkpoint-%s "
                    "(not uploaded) for checkpoint-%d; the last complete checkpoint is still safe",
                    _clock(stall.at), stall.fault, steps, step,
                )  # fmt: skip
            else:
                log.warning(
                    "checkpoint uploads are falling behind: dropped checkpoint-%s (not uploaded) for checkpoint-%d; "
                    "the store takes longer than the interval (no fault): checkpoint less often or use faster storage",
                    steps, step,
                )  # fmt: skip
        self._jobs.put(UploadJob(staged_dir, step, world_size, resume or {}, self.attempt, share))
        return dropped

    def _drop_waiting(self) -> list[int]:
        waiting: list[UploadJob] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                waiting.append(job)
            self._jobs.task_done()
        notices, dropped = newest_wins(waiting)
        for job in dropped:
            shutil.rmtree(job.staged_dir, ignore_errors=True)
        for notice in notices:
            self._jobs.put(notice)
        return [job.step for job in dropped]

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise CheckpointUploadError(
                f"uploading checkpoint-{self._failed_step} to {self.store.uri} failed: {self._failure}",
                "fix the storage problem above and restart: the run resumes from the last complete checkpoint",
            ) from self._failure

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued checkpoint is uploaded (or one fails, which is raised)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._jobs.unfinished_tasks and self._failure is None:
            if deadline is not None and time.monotonic() > deadline:
                raise CheckpointUploadError(
                    f"checkpoint uploads to {self.store.uri} did not finish within {timeout_s:.0f}s",
                    "the storage is too slow or unreachable; the last complete checkpoint is still safe",
                )
            time.sleep(0.02)
        self.raise_if_failed()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._jobs.put(None)
            self._thread.join()
            self._worker.close()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._failure is None:
                    self._upload(job)
            except CheckpointAbandonedError as abandoned:
                self.dropped += 1
                log.warning("%s", abandoned)
                if self._on_abandoned is not None:
                    self._on_abandoned(job.step if job else -1)
            except BaseException as error:  # kept, and re-raised in the training thread
                self._failure, self._failed_step = error, job.step if job else None
                log.exception("checkpoint upload failed; training will stop at its next checkpoint call")
            finally:
                if job is not None:
                    shutil.rmtree(job.staged_dir, ignore_errors=True)
                self._jobs.task_done()

    def _stalled(self, fault: UploadStall) -> None:
        """The upload process retries a transient fault: the first one starts a stall, the rest update it."""
        if self.stall is not None:
            self.stall = UploadStall(fault.action, fault.fault, self.stall.at)  # since the first
            return
        self.stall = fault
        deadline = getattr(getattr(self.store, "retry", None), "deadline_s", 0.0)
        log.warning(
            "checkpoint uploads stalled: the store answers %s to %s; retrying for up to %.0f s",
            fault.fault, fault.action, deadline,
        )  # fmt: skip
        if self._on_stall is not None:
            self._on_stall(fault)

    def _flowing(self) -> None:
        if self.stall is None:
            return
        log.warning(
            "checkpoint uploads flow again after %.0f s stalled on %s", time.time() - self.stall.at, self.stall.fault
        )
        self.stall = None
        if self._on_stall is not None:
            self._on_stall(None)

    def _upload(self, job: UploadJob) -> None:
        manifest, seconds = self._worker.run(self.store, job, self.keep)
        self._flowing()
        if not job.commits:
            log.info("checkpoint-%d: this node's part is in %s (%.2fs)", job.step, self.store.uri, seconds)
            return
        self.last_uploaded_step = job.step
        log.info(
            "checkpoint-%d complete in %s (%.1f MB in %.2fs)",
            job.step,
            self.store.uri,
            manifest.total_bytes / 1e6,
            seconds,
        )
        if self._on_uploaded is not None:
            self._on_uploaded(manifest, seconds)
