"""Which process this is among the training processes, and the few collectives spotray needs.

Ranks come from ``torch.distributed``, which both launchers (Ray Train and torchrun) set up; without
a process group this is rank 0 of 1 and the collectives return at once.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


def world_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


# Long enough for a gloo thread to finish freeing a collective's work (microseconds once it runs) on
# a loaded machine; paid once, when a process leaves its process group.
TEARDOWN_SETTLE_S = 0.2


def destroy_process_group() -> None:
    """``dist.destroy_process_group``, clear of a teardown deadlock of torch up to 2.7 with gloo.

    Those versions destroy ProcessGroupGloo holding the GIL and join its threads, while one of them
    may still be freeing the last collective's work, whose tensors need the GIL to drop their Python
    objects: each waits for the other for ever, and a process that finished its work never exits
    (torch 2.8 releases the GIL there: pytorch/pytorch#154976). Seen here with torch 2.6: the
    torchrun test of test_resume_fetch.py hung in 1 run of 12. Sleeping first releases the GIL, so
    that thread finishes before the join (tests/integration/test_process_group_teardown.py).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    time.sleep(TEARDOWN_SETTLE_S)
    dist.destroy_process_group()


def broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (itself when there is no process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, by rank (``[value]`` without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


@dataclass(frozen=True)
class MachineRanks:
    """Where this process stands among the training processes of its machine (its /dev/shm)."""

    local_rank: int
    local_world_size: int
    uniform: bool  # every machine runs the same number of training processes


def machine_ranks() -> MachineRanks:
    """This process among those on the same host, counted across the whole process group.

    Usually what the launcher says (LOCAL_RANK, LOCAL_WORLD_SIZE): one Ray node or pod per machine.
    Local mode can run two Ray nodes on one machine (the elastic tests lose and add one), and then
    both have a local rank 0, while what they share (/dev/shm, the MDS cache) is the machine's.
    Collective: every rank calls it.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return MachineRanks(0, 1, True)
    hosts: list[str] = all_gather_objects(socket.gethostname())
    mine = hosts[dist.get_rank()]
    counts = {host: hosts.count(host) for host in hosts}
    return MachineRanks(hosts[: dist.get_rank()].count(mine), counts[mine], len(set(counts.values())) == 1)


def launcher_local_ranks() -> tuple[int, int]:
    """LOCAL_RANK and LOCAL_WORLD_SIZE as the launcher set them (0 and 1 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
