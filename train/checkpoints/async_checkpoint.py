"""Checkpoints that block the training loop only for a copy into host memory.

The Hugging Face Trainer serializes a checkpoint synchronously: on a GPU that costs 50 to 100 times
what copying the same state into pinned host memory costs (issue #15's table). Here a save is two
halves:

1. In the training loop (``AsyncSaveTrainer._save_checkpoint``): the model's and the optimizer's
   tensors are copied into host buffers, reused from save to save. They are allocated once, in the
   background, after the first optimizer step (when the optimizer state they mirror exists):
   pinning 1.5 GB took 1.2 s on an H200, 40 times the copy, and no save waits for it now;
   the scheduler state and trainer state (small) are copied as they are; the RNG states are
   written at once by the Trainer's own ``_save_rng_state`` (a few KB, every rank its own file).
2. In one background thread (``SnapshotWriter``): the Trainer's own writers turn the snapshot into
   its own checkpoint layout (``model.safetensors`` through ``Trainer._save``, ``optimizer.pt``,
   ``scheduler.pt``, ``trainer_state.json``, ``training_args.bin``), so ``resume_from_checkpoint``
   and ``from_pretrained`` read it unchanged; then the checkpoint goes to the uploader like any other.

Why a Trainer subclass and not a callback: a callback that turns ``should_save`` off in ``on_step_end``
would have to run after every callback that turns it on (the spot-notice callback, the automatic
interval), and the Trainer's ``on_save`` hooks would no longer run. Overriding ``_save_checkpoint``
keeps the Trainer's control flow as it is: ``on_save`` still follows every save, on every rank.

Memory is bounded: one set of host buffers, so a save that comes while the previous snapshot is
still being written must wait for it or be skipped (``when_busy``). The last save before training
stops (the final step, a spot notice) is never skipped.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from transformers import Trainer, trainer_utils
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState

from spotray.contract.errors import CheckpointUploadError
from spotray.train.checkpoints.direct_load import DirectLoadTrainer
from spotray.train.checkpoints.save_policy import when_busy_policy

log = logging.getLogger(__name__)


class HostBuffers:
    """Host copies of a training state's tensors, allocated once (``reserve``, or the first ``copy``) and reused.

    Buffers are pinned when CUDA is there (a device-to-host copy into pinned memory runs at full
    bus speed and can be asynchronous); on a CPU-only machine they are ordinary memory. Tensors that
    share memory in the source (tied weights) share one buffer in the copy, so ``save_pretrained``
    sees the same sharing it would see in the live model.
    """

    def __init__(self, *, pin: bool | None = None) -> None:
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())

    def copy(self, name: str, tree: Any) -> Any:
        """``tree`` (dicts, lists and tuples of tensors and plain values) with its tensors copied into buffers."""
        copied = self._copy(name, tree, {}, fill=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # copies from the GPU were queued non-blocking: the snapshot is whole only now
        return copied

    def reserve(self, name: str, tree: Any) -> None:
        """Allocate the buffers ``copy(name, tree)`` will fill, copying nothing (safe off the training thread)."""
        self._copy(name, tree, {}, fill=False)

    def _copy(self, path: str, value: Any, aliases: dict[tuple[Any, ...], torch.Tensor], *, fill: bool) -> Any:
        if isinstance(value, torch.Tensor):
            source = value.detach()
            alias_key = (source.device, source.data_ptr(), source.dtype, tuple(source.shape), source.stride())
            if alias_key in aliases:
                return aliases[alias_key]
            buffer = self._buffer(path, source)
            if fill:
                buffer.copy_(source, non_blocking=buffer.is_pinned())
            aliases[alias_key] = buffer
            return buffer
        if isinstance(value, dict):
            return type(value)(
                (key, self._copy(f"{path}/{key}", item, aliases, fill=fill)) for key, item in value.items()
            )
        if isinstance(value, list | tuple):
            return type(value)(
                self._copy(f"{path}/{index}", item, aliases, fill=fill) for index, item in enumerate(value)
            )
        return copy.deepcopy(value) if fill else None

    def _buffer(self, path: str, source: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=self.pin)
            self._buffers[path] = buffer
        return buffer


@dataclass
class Snapshot:
    """One checkpoint's state in host memory, and how to write it as ``output_dir``."""

    step: int
    output_dir: Path
    write: Callable[[], None]
    copy_s: float  # seconds the training loop spent taking it


class SnapshotWriter:
    """Writes snapshots to disk in one background thread, one at a time, then hands each on.

    The writer owns the host buffers: ``begin`` is called before a snapshot is copied into them
    and decides, by ``when_busy``, what a save does while the previous snapshot is still being
    written ("wait": block until it is written; "skip": no checkpoint this time, counted). A
    failure is kept and raised on the training thread's next call.
    """

    def __init__(self, when_busy: str = "wait") -> None:
        self.when_busy = when_busy_policy(when_busy)
        self.buffers = HostBuffers()
        self.skipped = 0
        self.pending: Snapshot | None = None  # taken, not yet handed to the thread (on_save does that)
        self._idle = threading.Event()
        self._idle.set()
        self._buffers_ready = threading.Event()  # cleared while reserve_in_background allocates
        self._buffers_ready.set()
        self._failure: BaseException | None = None
        self._failed_step: int | None = None

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def begin(self, *, must_save: bool) -> bool:
        """Whether a snapshot may be taken now (waiting first if the policy or ``must_save`` says so)."""
        self.raise_if_failed()
        if self.busy and self.when_busy == "skip" and not must_save:
            self.skipped += 1
            return False
        self._idle.wait()
        self._buffers_ready.wait()
        self.raise_if_failed()
        return True

    def reserve_in_background(self, trees: dict[str, Any]) -> None:
        """Allocate the buffers for ``trees`` (name -> state dict) in the background; ``begin`` waits for it.

        A failure here is only logged: the first save allocates what is missing, and raises there.
        """
        self._buffers_ready.clear()

        def reserve() -> None:
            started = time.monotonic()
            try:
                for name, tree in trees.items():
                    self.buffers.reserve(name, tree)
                log.info(
                    "host buffers for checkpoints: %.2f GB in %.2fs",
                    self.buffers.nbytes / 1e9,
                    time.monotonic() - started,
                )
            except Exception:
                log.warning("allocating host buffers ahead of the first save failed; it will try again", exc_info=True)
            finally:
                self._buffers_ready.set()

        threading.Thread(target=reserve, name="spotray-reserve-host-buffers", daemon=True).start()

    def write_in_background(self, snapshot: Snapshot, then: Callable[[Snapshot], None]) -> None:
        """Write ``snapshot`` (and run ``then`` with it) in the background; the buffers are busy until done."""
        self._idle.clear()
        thread = threading.Thread(
            target=self._write, args=(snapshot, then), name=f"spotray-write-checkpoint-{snapshot.step}", daemon=True
        )
        thread.start()

    def _write(self, snapshot: Snapshot, then: Callable[[Snapshot], None]) -> None:
        try:
            started = time.monotonic()
            snapshot.write()
            log.info("checkpoint-%d written from host memory in %.2fs", snapshot.step, time.monotonic() - started)
            then(snapshot)
        except BaseException as error:  # kept, and raised in the training thread
            self._failure, self._failed_step = error, snapshot.step
            log.exception("writing checkpoint-%d from host memory failed", snapshot.step)
        finally:
            self._idle.set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until the snapshot being written is written and handed on; raises if writing failed."""
        if not self._idle.wait(timeout_s):
            raise CheckpointUploadError(
                f"writing a checkpoint from host memory did not finish within {timeout_s:.0f}s",
                "the local disk is too slow or full; the last complete checkpoint is still safe",
            )
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise CheckpointUploadError(
                f"writing checkpoint-{self._failed_step} from host memory failed: {self._failure}",
                "look at the error above (a full disk?) and restart: the run resumes from the last complete checkpoint",
            ) from self._failure


def sync_save_reason(trainer: Trainer) -> str | None:
    """Why this Trainer's checkpoints cannot be taken asynchronously, or None when they can."""
    args = trainer.args
    tensor_parallel = (getattr(trainer.model, "_tp_size", 0) or 0) > 1
    reasons = [
        (getattr(trainer, "is_fsdp_enabled", False), "FSDP's sharded state is saved by accelerate's own writer"),
        (getattr(trainer, "is_deepspeed_enabled", False), "DeepSpeed saves its own checkpoint"),
        (
            tensor_parallel or getattr(trainer.accelerator, "parallelism_config", None) is not None,
            "tensor or N-D parallel models are saved by accelerate's own writer",
        ),
        (args.push_to_hub, "push_to_hub uploads each checkpoint from the Trainer"),
        (
            args.metric_for_best_model is not None or bool(trainer.state.best_global_step),
            "tracking the best model needs its checkpoint on disk when the save returns",
        ),
        (args.save_on_each_node and args.world_size > 1, "save_on_each_node writes the whole checkpoint on every node"),
    ]
    return next((reason for applies, reason in reasons if applies), None)


class AsyncSaveTrainer(DirectLoadTrainer):
    """A Trainer whose saves block only for a copy to host memory (see the module docstring).

    Give it an ``S3CheckpointCallback(..., async_save=True)``: the callback owns the writer and the
    uploads. Without such a callback, or in a setting the async path does not cover
    (``sync_save_reason``), it saves as the Trainer always does. To add it to another Trainer
    subclass, put it first: ``class MyTrainer(AsyncSaveTrainer, SomeTrainer)``.

    It resumes as a ``DirectLoadTrainer``: weights and optimizer state read straight onto the device.
    """

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        # The first call after an optimizer step: the optimizer state exists, so its buffers can be made.
        if self.state.global_step >= 1 and not getattr(self, "_host_buffers_reserved", False):
            self._host_buffers_reserved = True
            writer = self._snapshot_writer()
            if writer is not None and self.args.should_save and self.model is not None and self.optimizer is not None:
                trees = {"model": self.model.state_dict()}
                if not self.args.save_only_model:
                    trees["optimizer"] = self.optimizer.state_dict()
                writer.reserve_in_background(trees)
        return super().training_step(*args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        writer = self._snapshot_writer()
        if writer is None or trial is not None:
            super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
            return
        must_save = bool(self.control.should_training_stop)  # the last save before stopping is never skipped
        may_take = writer.begin(must_save=must_save) if self.args.should_save else True
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            decision = [may_take]
            dist.broadcast_object_list(decision, src=0)  # every rank skips, or none does
            may_take = bool(decision[0])
        if not may_take:
            log.warning(
                "checkpoint at step %d skipped: the previous one is still being written (when_busy='skip')",
                self.state.global_step,
            )
            return
        started = time.monotonic()
        if self.hp_search_backend is None:
            self.store_flos()  # type: ignore[no-untyped-call]
        output_dir = Path(self._get_output_dir(trial=None)) / f"checkpoint-{self.state.global_step}"  # type: ignore[no-untyped-call]
        if not self.args.save_only_model:
            self._save_scaler(str(output_dir))  # type: ignore[no-untyped-call]
            self._save_rng_state(str(output_dir))  # type: ignore[no-untyped-call]  # every rank, its own file
        if not self.args.should_save:
            return
        write = self._capture(writer.buffers, output_dir)
        writer.pending = Snapshot(self.state.global_step, output_dir, write, copy_s=time.monotonic() - started)

    def _snapshot_writer(self) -> SnapshotWriter | None:
        for callback in self.callback_handler.callbacks:
            writer = getattr(callback, "snapshot_writer", None)
            if isinstance(writer, SnapshotWriter):
                reason = sync_save_reason(self)
                if reason is None:
                    return writer
                if not getattr(self, "_sync_reason_logged", False):
                    log.warning("async_save is on but checkpoints are saved synchronously: %s", reason)
                    self._sync_reason_logged = True
        return None

    def _capture(self, buffers: HostBuffers, output_dir: Path) -> Callable[[], None]:
        """Copy everything the checkpoint holds; return what writes it from the copy."""
        assert self.model is not None
        assert self.optimizer is not None
        assert self.lr_scheduler is not None
        self._export_callback_states()
        model_state = buffers.copy("model", self.model.state_dict())
        with_optimizer = not self.args.save_only_model
        optimizer_state = buffers.copy("optimizer", self.optimizer.state_dict()) if with_optimizer else None
        scheduler_state = copy.deepcopy(self.lr_scheduler.state_dict()) if with_optimizer else None
        trainer_state = copy.deepcopy(self.state)
        run_dir = self._get_output_dir(trial=None)  # type: ignore[no-untyped-call]

        def write() -> None:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._save(str(output_dir), state_dict=model_state)
            if optimizer_state is not None:
                torch.save(optimizer_state, output_dir / OPTIMIZER_NAME)
                torch.save(scheduler_state, output_dir / SCHEDULER_NAME)
            trainer_state.save_to_json(str(output_dir / TRAINER_STATE_NAME))
            self._rotate_local_checkpoints(run_dir)

        return write

    def _rotate_local_checkpoints(self, run_dir: str) -> None:
        """The Trainer's own ``save_total_limit`` rotation: a method before transformers 5.x, a function after."""
        rotate_method = getattr(self, "_rotate_checkpoints", None)
        if rotate_method is not None:
            rotate_method(use_mtime=True, output_dir=run_dir)
            return
        trainer_utils.rotate_checkpoints(  # type: ignore[attr-defined]
            output_dir=run_dir,
            save_total_limit=self.args.save_total_limit,
            best_model_checkpoint=self.state.best_model_checkpoint,
            use_mtime=True,
        )

    def _export_callback_states(self) -> None:
        """What ``Trainer._save_checkpoint`` records of stateful callbacks before writing the trainer state."""
        # Typed as a list in TrainerState, a dict by name in fact.
        recorded = cast(dict[str, Any], self.state.stateful_callbacks)
        for callback in [*self.callback_handler.callbacks, self.control]:
            if not isinstance(callback, ExportableState):
                continue
            name = callback.__class__.__name__
            if isinstance(recorded[name], list):
                recorded[name].append(callback.state())
            else:
                recorded[name] = callback.state()
