"""A training run's progress from the Hugging Face Trainer, under Ray Train, torchrun or plain python.

``ProgressCallback``: every logged step goes to the JSON-lines event log and to the attempt's
progress object in the store (rank 0, see train/records/progress_log.py), and so does a stall of
the checkpoint uploads on a store fault while it lasts; under Ray Train the end
of training also goes to ``ray.train.report`` (step, loss, the last complete checkpoint). Only the
end: each report is a barrier across ranks through a Ray actor that measured 2.0 s per call on this
machine; see docs/benchmarks.md (ray_vs_torchrun) for what reporting at every checkpoint cost. Live
progress is in the event log and in the checkpoints themselves. The spot notice is
train/hf/notice.py's. Neither imports Ray: under Ray Train it is already loaded.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.notice import in_ray_train
from spotray.train.records.event_log import EventLog
from spotray.train.records.progress_log import ProgressWriter, UploadStallNote

if TYPE_CHECKING:
    from spotray.train.records.progress_log import WorkerHosts

log = logging.getLogger(__name__)


# How often rank 0 of a run with spares reads which worker pods are idle (one GCS read): the
# controller moves an idle spare off its worker's node within about this long after it lands there.
WORKER_HOSTS_EVERY_S = 10.0


class ProgressCallback(TrainerCallback):
    """Each logged step to the event log; under Ray Train, the final state to ``ray.train.report``.

    ``worker_hosts`` (a run with spares, rank 0): reads which worker pods are idle and which train
    (train/launch/ray_capacity.py ``run_worker_hosts``), recorded in the progress every
    ``WORKER_HOSTS_EVERY_S``; a failed read is logged and skipped (it is advice to the controller).
    """

    def __init__(
        self,
        sync: S3CheckpointCallback,
        events: EventLog,
        progress: ProgressWriter | None = None,
        worker_hosts: Callable[[], WorkerHosts] | None = None,
    ) -> None:
        self.sync = sync
        self.events = events
        self.progress = progress  # rank 0 only: the attempt's progress object in the store
        self.worker_hosts = worker_hosts
        self.hosts_read_at = float("-inf")
        self.report_to_ray = in_ray_train()
        self.last_loss: float | None = None
        self.stall_recorded: UploadStallNote | None = None

    def _record_worker_hosts(self) -> None:
        if self.progress is None or self.worker_hosts is None:
            return
        now = time.monotonic()
        if now - self.hosts_read_at < WORKER_HOSTS_EVERY_S:
            return
        self.hosts_read_at = now
        try:
            hosts = self.worker_hosts()
        except Exception as error:  # noqa: BLE001 - advice for the controller; training goes on without it
            log.warning("could not read which worker pods are idle: %s", error)
            return
        self.progress.record_worker_hosts(hosts)

    def _record_upload_stall(self) -> None:
        """The uploads' stall as the S3 callback last heard of it, written when it starts or ends."""
        if self.progress is None:
            return
        stall = self.sync.upload_stall
        note = UploadStallNote(stall.at, stall.fault) if stall is not None else None
        if note != self.stall_recorded:
            self.progress.record_upload_stall(note)
            self.stall_recorded = note

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
            rate = logs.get("learning_rate")  # the rate this step used: a sweep's exploit changes it
            self.events.emit("step", step=state.global_step, loss=logs["loss"], max_steps=state.max_steps, lr=rate)
            if self.progress is not None:
                self.progress.record(state.global_step, logs["loss"])
            self._record_worker_hosts()
            self._record_upload_stall()

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
        sys.modules["ray.train"].report(metrics)  # loaded: report_to_ray says Ray Train runs this
