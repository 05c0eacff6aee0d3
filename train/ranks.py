"""Which process this is among the training processes, and the few collectives spotray needs.

Ranks come from ``torch.distributed``, which both launchers (Ray Train and torchrun) set up; without
a process group this is rank 0 of 1 and the collectives return at once.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def world_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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
