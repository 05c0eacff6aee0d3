"""Resume without the extra host copies the Trainer's loaders make (issue #18, item 2).

When it resumes, the stock Trainer reads the weights into host memory (``safetensors`` to "cpu")
and then copies them into the model on its device; on one device it reads the optimizer state into
host memory too, and ``Optimizer.load_state_dict`` then copies every tensor to the parameters'
device. ``DirectLoadTrainer`` reads both straight onto that device instead:

- the weights with ``safetensors.torch.load_file(..., device=<the model's device>)``;
- the optimizer state with ``torch.load(..., map_location=<device>, mmap=True)``: the file is mapped,
  not read into a buffer first, and each tensor goes from the page cache to its device once. On a
  CPU run the state stays backed by the mapping (copy-on-write: training never writes to the file)
  until the first step writes it.

It covers one model on one device per process (single process or DDP), in the Trainer's own layout,
which is also the one ``AsyncSaveTrainer`` writes. Anything else (FSDP, DeepSpeed, tensor parallel,
PEFT adapters, a model spread over devices, XLA, SageMaker) loads as the Trainer always does:
``direct_load_reason`` says why. On a GPU, the weights briefly exist twice on the device (the loaded
state and the model's parameters) instead of once in host memory and once on the device.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from transformers import Trainer
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from transformers.utils import SAFE_WEIGHTS_NAME
from transformers.utils.import_utils import is_sagemaker_mp_enabled

log = logging.getLogger(__name__)


def direct_load_reason(trainer: Trainer, model: torch.nn.Module) -> str | None:
    """Why this Trainer resumes through its own loaders, or None when ``DirectLoadTrainer``'s apply."""
    devices = {parameter.device for parameter in model.parameters()}
    reasons = [
        (getattr(trainer, "is_fsdp_enabled", False), "FSDP loads its sharded state itself"),
        (getattr(trainer, "is_deepspeed_enabled", False), "DeepSpeed loads its own checkpoint"),
        ((getattr(model, "_tp_size", 0) or 0) > 1, "tensor parallel models load through accelerate"),
        (hasattr(model, "peft_config"), "PEFT adapters load through the adapter's own loader"),
        (len(devices) != 1, "the model is spread over several devices"),
        (any(device.type == "xla" for device in devices), "XLA devices load through torch_xla"),
        (is_sagemaker_mp_enabled(), "SageMaker model parallelism loads its own checkpoint"),
    ]
    return next((reason for applies, reason in reasons if applies), None)


class DirectLoadTrainer(Trainer):
    """A Trainer that resumes with the weights and optimizer state read straight onto the model's device."""

    def _direct_device(self, model: torch.nn.Module | None) -> torch.device | None:
        if model is None:
            return None
        reason = direct_load_reason(self, model)
        if reason is not None:
            log.info("resuming through the Trainer's own loaders: %s", reason)
            return None
        return next(model.parameters()).device

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        target: torch.nn.Module | None = self.model if model is None else model
        weights = Path(resume_from_checkpoint) / SAFE_WEIGHTS_NAME
        device = self._direct_device(target) if weights.is_file() else None
        if target is None or device is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[no-untyped-call]
            return
        state_dict = safetensors.torch.load_file(str(weights), device=str(device))
        # strict=False as the Trainer does: tied weights (lm_head) are not in the file.
        load_result = target.load_state_dict(state_dict, False)
        del state_dict
        self._issue_warnings_after_load(load_result)  # type: ignore[no-untyped-call]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        optimizer_file = Path(checkpoint) / OPTIMIZER_NAME if checkpoint is not None else None
        direct = optimizer_file is not None and optimizer_file.is_file()
        device = self._direct_device(self.model) if direct else None
        if checkpoint is None or optimizer_file is None or device is None or self.optimizer is None:
            super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
            return
        # An indexed CPU device ("cpu:0") cannot be restored by torch.load: plain "cpu".
        location = "cpu" if device.type == "cpu" else device
        state = torch.load(optimizer_file, map_location=location, weights_only=True, mmap=True)
        self.optimizer.load_state_dict(state)
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / SCHEDULER_NAME, weights_only=True))
