"""What every training worker does around the Hugging Face Trainer, under Ray Train or under torchrun.

- ``ResumeFetch``: the checkpoint to resume from, downloaded in the background from the worker's
  first lines while it builds its model; rank 0 picks the newest complete checkpoint that verifies,
  every other rank ends with that same one (a newer checkpoint landing meanwhile must not split the
  ranks), and the ranks of one node share one copy. ``agree_on_resume_point`` starts one and waits.
- ``ProgressCallback``: every logged step goes to the JSON-lines event log and to the attempt's
  progress object in the store (rank 0, see train/progress_log.py); under Ray Train
  the end of training also goes to ``ray.train.report`` (step, loss, the last complete checkpoint).
  Only the end: each report is a barrier across ranks through a Ray actor that measured 2.0 s per
  call on this machine; see docs/benchmarks.md (ray_vs_torchrun) for what reporting at every
  checkpoint cost. Live progress is in the event log and in the checkpoints themselves.
- ``PreemptionNoticeCallback``: all ranks ask whether a preemption is coming. Under Ray Train that
  is ``ray.train.get_preemption_info`` (a node being drained: a pod's preStop hook runs
  ``ray drain-node``, or the driver got SIGTERM); under torchrun, a SIGTERM to any rank, shared
  with an all-reduce. Either way the question is a collective (8 ms measured on 2 loaded CPU
  cores), so it is asked about once a second, not every step: rank 0 times the first steps and
  every rank gets the same interval. On a notice the Trainer saves at once, the callback waits
  until that checkpoint is complete in the store, leaves a marker there, and training stops.

Only ``ray.train`` calls need Ray; ranks come from ``torch.distributed``, which both launchers set up.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.train.attempts import AttemptId, write_fence, write_preemption
from spotray.train.callback import S3CheckpointCallback
from spotray.train.checkpoint import (
    CheckpointInfo,
    complete_checkpoints,
    delete_other_copies,
    download_checkpoint,
    latest_complete_checkpoint,
)
from spotray.train.errors import CorruptCheckpointError
from spotray.train.events import EventLog
from spotray.train.extras import extra_required
from spotray.train.progress_log import ProgressWriter
from spotray.train.resume import ResumePoint, fetch_resume_checkpoint
from spotray.train.store import ObjectStore

with extra_required("ray"):
    import ray.train

log = logging.getLogger(__name__)


def world_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def in_ray_train() -> bool:
    """True inside a function that Ray Train's ``fit()`` launched."""
    try:
        ray.train.get_context()
    except RuntimeError:
        return False
    return True


class SigtermNotice:
    """The preemption notice without Ray: SIGTERM to any rank (torchrun forwards it to all), agreed by all-reduce."""

    def __init__(self) -> None:
        self.received = False
        signal.signal(signal.SIGTERM, self._on_sigterm)  # the worker's main thread: torchrun runs us there

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.received = True

    def __call__(self) -> object | None:
        flag = torch.tensor([1 if self.received else 0])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return "sigterm" if int(flag.item()) else None


def default_notice() -> Callable[[], object | None]:
    return ray.train.get_preemption_info if in_ray_train() else SigtermNotice()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (itself when there is no process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def node_resume_dir(workdir: Path) -> Path:
    """Where the processes of a node keep the one copy of the checkpoint they resumed from."""
    return workdir / "resume"


class ResumeFetch:
    """The checkpoint to resume from, fetched in the background while the worker builds its model.

    Started as early as the worker starts; ``wait`` (every rank, from the main thread) returns the
    same verified checkpoint on every rank, or None on a fresh start:

    - rank 0's thread downloads the newest complete checkpoint that verifies (an older one when the
      newest turns out corrupt: ``fetch_resume_checkpoint``);
    - every other rank's thread downloads the newest complete checkpoint it sees, betting that rank 0
      ends with the same one (a corrupt newest or a checkpoint landing meanwhile lose the bet);
    - ``wait`` broadcasts rank 0's choice; a rank that fetched another step downloads that one then.

    Collectives run only in ``wait``, on the main thread: the threads only talk to the store. Ranks of
    one node share ``dest_root`` (``download_checkpoint`` lets one download and the others reuse it).
    """

    def __init__(self, store: ObjectStore, dest_root: Path, attempt: AttemptId | None = None) -> None:
        self.store = store
        self.dest_root = dest_root
        self.attempt = attempt
        self.rank = world_rank()
        self.fetched: ResumePoint | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.fetch_s: float | None = None  # how long the background fetch took
        self.waited_s: float | None = None  # how long ``wait`` blocked on it: the part not hidden
        self._thread = threading.Thread(target=self._fetch, name="spotray-resume-fetch", daemon=True)
        self._thread.start()

    def _fetch(self) -> None:
        try:
            if self.rank == 0:
                self.fetched = fetch_resume_checkpoint(self.store, self.dest_root)
            else:
                newest = latest_complete_checkpoint(self.store)
                self.fetched = _fetch_agreed(self.store, newest, self.dest_root) if newest else None
        except BaseException as error:  # noqa: BLE001 - raised (or superseded) in wait()
            self.error = error
        self.fetch_s = time.monotonic() - self.started

    def wait(self) -> ResumePoint | None:
        blocked_from = time.monotonic()
        self._thread.join()
        self.waited_s = time.monotonic() - blocked_from
        if self.rank == 0 and self.error is not None:
            raise self.error
        chosen = self.fetched if self.rank == 0 else None
        if chosen is not None and self.attempt is not None:
            write_fence(self.store, self.attempt, resumed_from=chosen.step)
        step = broadcast_from_rank0(chosen.step if chosen else None)
        if self.rank != 0:
            chosen = self._agreed(step)
        if chosen is not None:
            barrier()  # every rank of the node is done downloading: the copies of other steps can go
            delete_other_copies(self.dest_root, chosen.step)
        return chosen

    def _agreed(self, step: int | None) -> ResumePoint | None:
        """On a rank other than 0: the checkpoint rank 0 chose, from the bet when it won."""
        if step is None:
            return None
        if self.fetched is not None and self.fetched.step == step:
            return self.fetched
        if self.error is not None and not isinstance(self.error, CorruptCheckpointError):
            raise self.error  # the store failed this rank: what the step is does not change that
        return _fetch_agreed(self.store, _find_complete(self.store, step), self.dest_root)


def agree_on_resume_point(store: ObjectStore, dest_root: Path, attempt: AttemptId | None = None) -> ResumePoint | None:
    """The same verified checkpoint on every rank, or None on a fresh start (``ResumeFetch``, waited for).

    With ``attempt``, rank 0 records the step in the fence (train/attempts.py): pruning never
    deletes the checkpoint a running attempt resumed from.
    """
    return ResumeFetch(store, dest_root, attempt).wait()


def _fetch_agreed(store: ObjectStore, info: CheckpointInfo, dest_root: Path) -> ResumePoint:
    try:
        local_dir = download_checkpoint(store, info, dest_root)
    except CorruptCheckpointError as error:
        # Rank 0 verifies these same bytes; a mismatch here is a bad copy on this node.
        raise CorruptCheckpointError(f"rank {world_rank()}: {error.problem}", error.fix) from error
    assert info.manifest is not None
    return ResumePoint(info.step, local_dir, info.manifest, str(store.uri.join(info.prefix)))


def _find_complete(store: ObjectStore, step: int) -> CheckpointInfo:
    for info in complete_checkpoints(store):
        if info.step == step:
            return info
    raise CorruptCheckpointError(
        f"checkpoint-{step}, chosen by rank 0 for resume, is no longer complete in {store.uri}",
        "something deleted it while the run started (another run with the same checkpoint URI?); "
        "give each run its own URI",
    )


class ProgressCallback(TrainerCallback):
    """Each logged step to the event log; under Ray Train, the final state to ``ray.train.report``."""

    def __init__(self, sync: S3CheckpointCallback, events: EventLog, progress: ProgressWriter | None = None) -> None:
        self.sync = sync
        self.events = events
        self.progress = progress  # rank 0 only: the attempt's progress object in the store
        self.report_to_ray = in_ray_train()
        self.last_loss: float | None = None

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or "loss" not in logs:
            return
        self.last_loss = logs["loss"]
        if state.is_world_process_zero:
            self.events.emit("step", step=state.global_step, loss=logs["loss"], max_steps=state.max_steps)
            if self.progress is not None:
                self.progress.record(state.global_step, logs["loss"])

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # After the S3 callback's on_save (it comes first in the list), which measured the stall.
        stall = self.sync.stall_at(state.global_step)
        if self.progress is not None and stall is not None:
            self.progress.record_checkpoint_stall(state.global_step, stall)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.progress is not None and not self.progress.close():
            log.warning("the last training progress did not reach the store in time (it is best effort)")
        if not self.report_to_ray:
            return
        # Runs after the S3 callback's on_train_end (it comes first in the list), so the final
        # checkpoint's upload is done and last_complete_step is current.
        metrics: dict[str, Any] = {"step": state.global_step, "max_steps": state.max_steps, "loss": self.last_loss}
        if self.sync.last_complete_step is not None:
            metrics["last_checkpoint_step"] = self.sync.last_complete_step
        ray.train.report(metrics)


class PreemptionNoticeCallback(TrainerCallback):
    """On a drain notice: save now, wait for the upload to complete, stop (see the module docstring)."""

    def __init__(
        self,
        sync: S3CheckpointCallback,
        events: EventLog,
        *,
        attempt: AttemptId,
        target_interval_s: float = 1.0,
        calibration_steps: int = 5,
        notice: Callable[[], object | None] | None = None,
    ) -> None:
        self.sync = sync
        self.events = events
        self.attempt = attempt
        self.target_interval_s = target_interval_s
        self.calibration_steps = calibration_steps
        self.notice = notice or default_notice()
        self.check_every_steps = 1  # until calibrated
        self.steps_seen = 0
        self.calibration_started: float | None = None
        self.noticed_at: float | None = None
        self.stopped_at_step: int | None = None

    def _calibrate(self) -> None:
        """After a few steps, agree on how many steps make about ``target_interval_s`` (rank 0 decides)."""
        self.steps_seen += 1
        if self.steps_seen == 1:
            self.calibration_started = time.monotonic()  # the first step pays for warm-up: not counted
        elif self.steps_seen == self.calibration_steps + 1 and self.calibration_started is not None:
            step_s = (time.monotonic() - self.calibration_started) / self.calibration_steps
            every = max(1, min(100, round(self.target_interval_s / max(step_s, 1e-6))))
            self.check_every_steps = int(broadcast_from_rank0(every))

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._calibrate()
        if self.noticed_at is not None or self.steps_seen % self.check_every_steps:
            return
        if state.global_step >= state.max_steps:
            return  # the last step saves and ends anyway: nothing to do early
        info = self.notice()  # a barrier: every rank calls it after the same number of steps
        if info is None:
            return
        self.noticed_at = time.monotonic()
        log.warning("preemption notice at step %d: saving an emergency checkpoint", state.global_step)
        if state.is_world_process_zero:
            deadline_ms = getattr(info, "deadline_ms", None)  # Ray's notice has one; SIGTERM's does not
            self.events.emit("preemption_notice", step=state.global_step, deadline_ms=deadline_ms)
        control.should_save = True
        control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.noticed_at is None or self.stopped_at_step is not None:
            return
        self.sync.flush()  # on rank 0 this waits until the checkpoint is complete in the store
        barrier()  # no rank reports "preempted" before the checkpoint is safe
        self.stopped_at_step = state.global_step
        if state.is_world_process_zero:
            seconds = time.monotonic() - self.noticed_at
            write_preemption(self.sync.store, self.attempt, state.global_step, seconds)
            self.events.emit("emergency_checkpoint", step=state.global_step, seconds=round(seconds, 3))
            log.warning("emergency checkpoint-%d complete %.1f s after the notice", state.global_step, seconds)
