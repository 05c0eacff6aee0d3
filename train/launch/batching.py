"""One global batch whatever the number of workers: how an elastic run keeps the optimization it was given.

An elastic run (``spec.workers.minReplicas`` below ``replicas``) trains with fewer workers while spot
nodes are missing. Each optimizer step must still see the global batch the user asked for, or the
learning rate, the schedule and the results would silently change with the spot market. So every
worker takes ``global_batch / world_size`` samples a step, and when that is more than a device took
at full size, it takes them in several forward passes (gradient accumulation): a device never holds
a bigger batch than at full size, so a run that fits at full size fits with fewer workers.

Together with the exact data position (train/hf/data.py), a step covers the same samples at any size.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotray.contract.errors import SpotrayError
from spotray.contract.spec import WorkerSpec


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's samples are taken by ``world_size`` workers."""

    per_device: int  # samples per forward pass on each worker
    accumulation: int  # forward passes per optimizer step
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.per_device * self.accumulation * self.world_size


def check_batch_splits(global_batch: int, workers: WorkerSpec) -> None:
    """Refuse a global batch that some worker count of the run cannot split evenly."""
    uneven = [count for count in workers.worker_counts if global_batch % count]
    if uneven:
        counts = ", ".join(map(str, uneven))
        raise SpotrayError(
            f"--batch-size {global_batch} does not split evenly over {counts} workers, and this run "
            f"may have {workers.min_workers} to {workers.num_workers}",
            "make the global batch size a multiple of every worker count in that range "
            "(or narrow it with spec.workers.minReplicas)",
        )


def plan_batch(global_batch: int, world_size: int, max_world_size: int) -> BatchPlan:
    """The plan for ``world_size`` workers: the smallest accumulation that keeps each forward pass
    at most as big as at ``max_world_size``. The caller has checked that both sizes split the batch."""
    if global_batch % world_size or global_batch % max_world_size or world_size > max_world_size:
        raise ValueError(f"cannot split {global_batch} samples over {world_size} of {max_world_size} workers")
    per_worker = global_batch // world_size
    largest_pass = global_batch // max_world_size
    accumulation = next(a for a in range(1, per_worker + 1) if per_worker % a == 0 and per_worker // a <= largest_pass)
    return BatchPlan(per_worker // accumulation, accumulation, world_size)
