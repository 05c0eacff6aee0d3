"""The floor under an async save's wait: a trainer's model and optimizer tensors copied into warm host buffers."""

from __future__ import annotations

import time

from transformers import Trainer

from spotray.train.checkpoints.async_checkpoint import HostBuffers


def copy_floor_s(trainer: Trainer, repeats: int = 3) -> float:
    """The fastest of ``repeats`` copies (pinned buffers with CUDA), timed alone.

    The first copy allocates the buffers and is not counted: an async save reuses its buffers.
    """
    assert trainer.model is not None
    assert trainer.optimizer is not None
    buffers = HostBuffers()
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        buffers.copy("model", trainer.model.state_dict())
        buffers.copy("optimizer", trainer.optimizer.state_dict())
        timings.append(time.perf_counter() - started)
    return min(timings[1:])
