"""The spot notice in a Hugging Face Trainer: save at once, wait until the checkpoint is safe, stop.

``PreemptionNoticeCallback``: all ranks ask whether a preemption is coming. Under Ray Train that is
``ray.train.get_preemption_info`` (a node being drained as a preemption: a worker pod's preStop hook
runs ``python -m spotray.train.launch.drain``, or the driver got SIGTERM and drained every node);
anywhere else (torchrun, plain python) a SIGTERM to any rank, shared with an all-reduce when there
is a process group. Either way the question is a collective (8 ms measured on 2 loaded CPU cores),
so it is asked about once a second, not every step: rank 0 times the first steps and every rank
gets the same interval. On a notice the Trainer saves at once, the callback waits until that
checkpoint is complete in the store, leaves a marker there (for spotray's controller, when the
checkpoint callback knows its attempt), and training stops.

An elastic group that can do without the ranks the notice names (``goes_on_without``) keeps
training instead: once the emergency checkpoint is safe, the ranks on the draining node tell its
preStop hook (train/processes/drain_handshake.py), the node goes, and Ray Train restarts the group
smaller from that checkpoint, in the same attempt. A fixed-size group with spare pods does the same
when Ray has room for the ranks the notice takes (read on rank 0 at the notice): Ray Train restarts
it at full size, on a spare. For these two, "safe" comes sooner than the store when the nodes that
stay hold every file of the checkpoint (train/checkpoints/node_copies.py ``copies_hold_the_save``,
waited for at most ``PEER_COPY_WAIT_S``): the restart in the same Ray cluster finds those copies and
completes the checkpoint in the store before it resumes (train/checkpoints/complete_from_copies.py).
A run that stops on a notice still waits for the store, since its pods may go with the attempt.

Ray is never imported here: under Ray Train it is already loaded (``in_ray_train``), so a script
outside Ray needs only ``spotray[train]``.

    from spotray import PreemptionNoticeCallback, S3CheckpointCallback
    sync = S3CheckpointCallback("s3://bucket/run")
    trainer = Trainer(..., callbacks=[sync, PreemptionNoticeCallback(sync)])
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.contract.attempts import AttemptId
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.processes.drain_handshake import mark_checkpointed
from spotray.train.processes.ranks import barrier, broadcast_from_rank0, world_rank, world_size
from spotray.train.records.attempt_records import write_preemption
from spotray.train.records.event_log import EventLog, event_log_from_env

log = logging.getLogger(__name__)

# How long an emergency checkpoint waits for the ring to copy it to the nodes that stay before it waits
# for the store instead (the ring moves a node's share at its network's speed: seconds for tens of GB).
PEER_COPY_WAIT_S = 60.0


def in_ray_train() -> bool:
    """True inside a function that Ray Train's ``fit()`` launched.

    Ray Train's worker has imported ``ray.train`` before it runs the function; a script that never
    did is not under Ray Train, and is not made to import Ray (seconds, and an extra) to learn it.
    """
    ray_train = sys.modules.get("ray.train")
    if ray_train is None:
        return False
    try:
        ray_train.get_context()
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
            if dist.get_backend() == "nccl":  # NCCL reduces GPU tensors only
                flag = flag.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return "sigterm" if int(flag.item()) else None


def default_notice() -> Callable[[], object | None]:
    """Ray Train's drain notice under Ray Train; elsewhere (torchrun, plain python) a SIGTERM."""
    if in_ray_train():
        return cast("Callable[[], object | None]", sys.modules["ray.train"].get_preemption_info)
    return SigtermNotice()


def ray_node_id() -> str | None:
    """This worker's Ray node, None outside Ray."""
    if not in_ray_train():
        return None
    return str(sys.modules["ray"].get_runtime_context().get_node_id())


def notice_ranks(info: object) -> frozenset[int]:
    """The ranks a notice takes: Ray's ``PreemptionInfo`` names them; a SIGTERM notice takes every rank (empty)."""
    return frozenset(getattr(info, "preempted_ranks", None) or ())


def goes_on_without(ranks: frozenset[int], size: int, min_workers: int | None, room: int = 0) -> bool:
    """Whether a group of ``size`` ranks can go on without ``ranks``, restarting on the ranks left and
    on ``room`` workers' worth of free capacity elsewhere (spare pods): an elastic run needs at least
    ``min_workers`` of them, a fixed-size run (``min_workers`` None) all ``size``.

    A notice that names no rank (a SIGTERM, or Ray's for a node that holds none of ours) stops the
    whole group, and so does one a fixed-size run gets with no room for the ranks it takes.
    """
    if not ranks:
        return False
    lost = len(ranks & set(range(size)))
    needed = size if min_workers is None else max(1, min_workers)
    return size - lost + min(room, lost) >= needed


class PreemptionNoticeCallback(TrainerCallback):
    """On a drain notice: save now, wait for the upload to complete, stop (see the module docstring)."""

    def __init__(
        self,
        sync: S3CheckpointCallback,
        events: EventLog | None = None,
        *,
        attempt: AttemptId | None = None,
        target_interval_s: float = 1.0,
        calibration_steps: int = 5,
        notice: Callable[[], object | None] | None = None,
        min_workers: int | None = None,
        spare_room: Callable[[], int] | None = None,
        node_id: Callable[[], str | None] = ray_node_id,
    ) -> None:
        self.sync = sync
        self.events = events if events is not None else event_log_from_env()
        # The attempt whose preemption marker the controller reads; outside spotray's own jobs, none.
        self.attempt = attempt if attempt is not None else sync.attempt
        self.target_interval_s = target_interval_s
        self.calibration_steps = calibration_steps
        self.notice = notice or default_notice()
        self.min_workers = min_workers  # an elastic run's minimum; None: a fixed size
        # How many workers could start now outside the draining nodes (read on rank 0 at a notice);
        # None: the run has no spares, so a fixed-size group stops at any notice.
        self.spare_room = spare_room
        self.node_id = node_id
        self.check_every_steps = 1  # until calibrated
        self.steps_seen = 0
        self.calibration_started: float | None = None
        self.noticed_at: float | None = None
        self.stopped_at_step: int | None = None
        # An elastic group going on without these ranks, once their emergency checkpoint is safe.
        self.going_on_without: frozenset[int] = frozenset()

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
        if self.stopped_at_step is not None or self.steps_seen % self.check_every_steps:
            return
        if state.global_step >= state.max_steps:
            return  # the last step saves and ends anyway: nothing to do early
        info = self.notice()  # a barrier: every rank calls it after the same number of steps
        if info is None:
            return
        ranks = notice_ranks(info)
        if ranks and ranks <= self.going_on_without:
            return  # the notice this group already went on without (Ray repeats it until the node is gone)
        self.noticed_at = time.monotonic()
        size = world_size()
        room = None
        go_on = goes_on_without(ranks, size, self.min_workers)
        if not go_on and ranks and self.spare_room is not None:
            room = self._room()  # every rank gets here alike: they share the notice and the spec
            go_on = goes_on_without(ranks, size, self.min_workers, room)
        log.warning(
            "preemption notice at step %d: saving an emergency checkpoint, then %s%s",
            state.global_step,
            f"going on without ranks {sorted(ranks)}" if go_on else "stopping",
            "" if room is None else f" (room for {room} worker(s) outside the draining nodes)",
        )
        if state.is_world_process_zero:
            deadline_ms = getattr(info, "deadline_ms", None)  # Ray's notice has one; SIGTERM's does not
            self.events.emit(
                "preemption_notice", step=state.global_step, deadline_ms=deadline_ms, going_on=go_on,
                ranks=sorted(ranks) or None, spare_room=room,
            )  # fmt: skip
        control.should_save = True
        if go_on:
            self.going_on_without = ranks
        else:
            self.going_on_without = frozenset()
            control.should_training_stop = True
            self.sync.leave()

    def _room(self) -> int:
        """Rank 0's reading of the spare room, on every rank (a collective)."""
        assert self.spare_room is not None
        return int(broadcast_from_rank0(self.spare_room() if world_rank() == 0 else 0))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.noticed_at is None or self.stopped_at_step is not None:
            return
        # Going on without a node, the group restarts on the nodes that stay, whose copies of the
        # checkpoint outlive it: once they hold every file, the node may go before the upload ends (on
        # GKE a notice is about 15 s). Stopping, the attempt's pods may all go: only the store is safe.
        safe_in = "store"
        if self.going_on_without and self.sync.copies_hold(state.global_step, self.going_on_without, PEER_COPY_WAIT_S):
            safe_in = "node copies"
        else:
            self.sync.flush()  # on rank 0 this waits until the checkpoint is complete in the store
        barrier()  # no rank reports "preempted" (or lets its node go) before the checkpoint is safe
        if self.going_on_without:
            self._let_the_node_go(state, safe_in)
            return
        self.stopped_at_step = state.global_step
        if state.is_world_process_zero:
            seconds = time.monotonic() - self.noticed_at
            if self.attempt is not None:
                write_preemption(self.sync.store, self.attempt, state.global_step, seconds)
            self.events.emit("emergency_checkpoint", step=state.global_step, seconds=round(seconds, 3))
            log.warning("emergency checkpoint-%d complete %.1f s after the notice", state.global_step, seconds)

    def _let_the_node_go(self, state: TrainerState, safe_in: str) -> None:
        """The elastic path: the checkpoint is safe, so the ranks on a draining node tell its hook, and all
        train on (``safe_in``: where it is safe, the store or the copies on the nodes that stay)."""
        assert self.noticed_at is not None
        seconds = time.monotonic() - self.noticed_at
        self.noticed_at = None  # the next notice, if one comes, is a new one
        if state.is_world_process_zero:
            self.events.emit(
                "emergency_checkpoint", step=state.global_step, seconds=round(seconds, 3),
                going_on_without=sorted(self.going_on_without), safe_in=safe_in,
            )  # fmt: skip
        node = self.node_id()
        if world_rank() in self.going_on_without and node is not None:
            mark_checkpointed(node)
        log.warning(
            "emergency checkpoint-%d safe in the %s %.1f s after the notice; training on until ranks %s are gone",
            state.global_step,
            safe_in,
            seconds,
            sorted(self.going_on_without),
        )
