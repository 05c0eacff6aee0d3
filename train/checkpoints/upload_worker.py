"""The upload process: hashes, uploads and prunes checkpoints outside the training process.

Why a separate process: botocore and s3transfer are Python, so upload threads inside the training
process hold its GIL and slow every step (measured: several percent of throughput on 2 cores). A
child process has its own GIL.

Why not ``multiprocessing``: its spawn start method re-imports the parent's main script in the
child, which for a training script means importing torch and transformers again (about 800 MB and
seconds of CPU) just to upload files. This child runs ``python -m spotray.train.checkpoints.upload_worker`` and imports
only what uploading needs. Requests and replies are pickled over its stdin and stdout.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import CheckpointUploadError
from spotray.train.checkpoints.checkpoint import Manifest, prune_checkpoints, upload_checkpoint
from spotray.train.checkpoints.node_parts import NodeSave, upload_node_part, upload_shared_checkpoint
from spotray.train.processes.subprocesses import die_with_parent
from spotray.train.storage.store import ObjectStore, S3ObjectStore

# The upload process runs at normal priority on purpose. At niceness 10 a CPU-bound training run
# starved it: in a test, checkpoint-20 was still not in S3 thirteen steps later, so a kill lost two
# intervals instead of one; and the niceness bought no measurable throughput (docs/benchmarks.md).

# The folder that holds the `spotray` package (site-packages, or a checkout), put first on the
# child's path so that `-m spotray.train.checkpoints.upload_worker` finds this same copy of spotray even when
# it was imported through a sys.path entry the child would not inherit.
_SPOTRAY_PARENT = Path(__file__).parents[4]  # spotray/train/checkpoints/upload_worker.py

# Processes tried per checkpoint: a process lost once is replaced; lost twice, the upload fails.
UPLOAD_PROCESS_TRIES = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadStall:
    """The upload process is retrying a transient fault: which request, the fault, and when (epoch s)."""

    action: str
    fault: str
    at: float


@dataclass(frozen=True)
class UploadJob:
    """One staged checkpoint to upload as ``checkpoint-<step>/``."""

    staged_dir: Path
    step: int
    world_size: int
    resume: dict[str, Any]
    attempt: AttemptId | None = None  # fences the upload and the prune (spotray/contract/attempts.py)
    share: NodeSave | None = None  # this node's share when several nodes save it (train/checkpoints/node_parts.py)

    @property
    def commits(self) -> bool:
        """Whether this job writes the manifest (and prunes): every job but another node's part."""
        return self.share is None or self.share.node == 0


def upload_and_prune(store: ObjectStore, job: UploadJob, keep: int) -> tuple[Manifest, float]:
    """The work of one checkpoint: upload (manifest last), then prune to ``keep``.

    Another node's share of a checkpoint is only uploaded, with its part record; what is returned
    then describes that part.
    """
    started = time.monotonic()
    if job.share is not None and not job.commits:
        part = upload_node_part(store, job.staged_dir, job.step, job.share, attempt=job.attempt)
        return Manifest(job.step, job.world_size, part.files, time.time()), time.monotonic() - started
    if job.share is not None:
        manifest = upload_shared_checkpoint(
            store, job.staged_dir, job.step, job.world_size, job.resume, share=job.share, attempt=job.attempt
        )
    else:
        manifest = upload_checkpoint(store, job.staged_dir, job.step, job.world_size, job.resume, attempt=job.attempt)
    seconds = time.monotonic() - started
    prune_checkpoints(store, keep, attempt=job.attempt, just_uploaded=job.step)
    return manifest, seconds


class UploadWorker:
    """The training process's handle on the upload process; one request at a time."""

    def __init__(self, on_stall: Callable[[UploadStall], None] | None = None) -> None:
        self.on_stall = on_stall  # called in the requesting thread for each fault the child retries
        self._process: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None

    def start(self) -> None:
        """Start the process now, so that its start-up (imports) is not paid by the first checkpoint."""
        if self._process is not None:
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_SPOTRAY_PARENT), os.environ.get("PYTHONPATH", "")])}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "spotray.train.checkpoints.upload_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - one prctl call, see its docstring
        )
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._requests = Connection(os.dup(self._process.stdin.fileno()), readable=False)
        self._replies = Connection(os.dup(self._process.stdout.fileno()), writable=False)

    def run(self, store: ObjectStore, job: UploadJob, keep: int) -> tuple[Manifest, float]:
        """Upload and prune in the child; its exception, if any, is raised here.

        A child that dies mid-request (a stray SIGKILL, the OOM killer) is replaced and the request
        sent again: uploading is idempotent (the manifest goes last) and the staged files are still
        here, so one lost process costs no checkpoint. A child that dies twice on the same
        checkpoint is reported: that is a cause to look at, not bad luck.
        """
        for tries_left in reversed(range(UPLOAD_PROCESS_TRIES)):
            try:
                status, payload, trace = self._request(store, job, keep)
                break
            except CheckpointUploadError:
                if not tries_left:
                    raise
                log.warning("the upload process died uploading checkpoint-%d; starting a new one", job.step)
        if status == "error":
            payload.add_note(f"in the upload process:\n{trace}")
            raise payload
        result: tuple[Manifest, float] = payload
        return result

    def _request(self, store: ObjectStore, job: UploadJob, keep: int) -> tuple[str, Any, str]:
        self.start()
        assert self._requests is not None
        assert self._replies is not None
        try:
            self._requests.send((store, job, keep))
            reply: tuple[str, Any, str] = self._replies.recv()
            while reply[0] == "stall":  # the child retries a transient fault; the answer comes later
                if self.on_stall is not None:
                    action, fault, at = reply[1]
                    self.on_stall(UploadStall(str(action), str(fault), float(at)))
                reply = self._replies.recv()
        except (EOFError, OSError) as error:
            code = self._exit_code()
            self.close()
            raise CheckpointUploadError(
                f"the upload process died while uploading checkpoint-{job.step} (exit code {code})",
                "look for an out-of-memory kill or a crash above; the last complete checkpoint is still safe",
            ) from error
        return reply

    def _exit_code(self) -> int | None:
        """The exit code of a process whose pipe just closed: it may take a moment to be reaped."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None  # its pipe closed but it lives on: close() kills it

    def close(self) -> None:
        for connection in (self._requests, self._replies):
            if connection is not None:
                connection.close()
        self._requests = self._replies = None
        if self._process is not None:
            for stream in (self._process.stdin, self._process.stdout):
                if stream is not None:
                    stream.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


def _serve() -> None:
    """The child's loop: answer each request until the parent closes the pipe."""
    requests = Connection(os.dup(0), writable=False)
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # a stray print must not corrupt the reply stream
    sending = threading.Lock()  # the store retries on s3transfer's threads too: one message at a time

    def report(action: str, fault: str) -> None:
        with sending:
            # Plain values: this module runs as __main__ here, so its classes would not unpickle there.
            replies.send(("stall", (action, fault, time.time()), ""))

    while True:
        try:
            store, job, keep = requests.recv()
        except EOFError:
            return
        if isinstance(store, S3ObjectStore):
            store.on_transient_fault = report
        try:
            result = upload_and_prune(store, job, keep)
            with sending:
                replies.send(("ok", result, ""))
        except Exception as error:  # noqa: BLE001 - every failure goes back to the training process
            trace = traceback.format_exc()
            with sending:
                try:
                    replies.send(("error", error, trace))
                except Exception:  # noqa: BLE001 - an exception that cannot be pickled is sent as text
                    replies.send(("error", RuntimeError(f"{type(error).__name__}: {error}"), trace))


if __name__ == "__main__":
    _serve()
