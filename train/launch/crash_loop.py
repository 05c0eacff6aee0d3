"""Crash-loop detection: a training loop that keeps crashing ends its attempt as a failure.

Ray Train replaces a worker group whose worker failed (``FailureConfig(max_failures=-1)``), which
is right when a node was lost, or a process once: the new group resumes from the latest complete
checkpoint. It is wrong when the training code itself crashes the same way every time (a bug, an
out-of-memory error or kill, a segfault, a deleted bucket): the group is replaced for ever, the
RayJob stays RUNNING and ``spec.retry.maxFailures`` is never spent.

So every worker's loop runs under ``guard_against_crash_loops``, which keeps a small actor the
driver owns for the attempt (the ``CrashLedger``) told of each worker group: its start (rank 0:
the group's size, the Ray nodes alive, the newest complete checkpoint), an exception from the
training code (reported before it propagates, with the newest complete checkpoint at that moment,
None when the store cannot say, and the traceback's last lines) and a normal return. A group that
ended in none of these ways died silently: a worker killed by a signal, the OOM killer or a
segfault. The next group's start counts it as a crash of the training code against the newest
checkpoint then, unless a node alive at the dead group's start is gone (a spot reclaim, a removed
Ray node: infrastructure, retried without limit) or the group size changed (an elastic group that
Ray Train stopped to resize). The ledger lives in Ray, not in the store, because a deleted bucket
or revoked credentials is one of the loops to catch. When a new worker group starts and the last
``MAX_CRASHES_WITHOUT_PROGRESS`` crashes, exceptions and silent deaths alike, all saw the same
newest checkpoint (no progress in between), every rank returns without training; ``fit()`` then
returns normally and the driver reads the verdict, with the last error in its message.

Each crash carries its cause (spotray/contract/errors.py ``cause_of``), and the verdict the last
crash's: only the training code's own exceptions end the attempt as a failure (exit code 1, which
spends ``spec.retry.maxFailures``); bad input (refused credentials, a deleted bucket, a checkpoint
no model loads) fails the run (2), at its first crash: a retry would meet the same input; an
infrastructure fault (an unreachable store, a failed upload, a newer attempt holding the
fence) ends the attempt as an interruption (75), which spends nothing and is tried again after a
backoff, so a store that is down for a while costs no budget.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import Cause, cause_of
from spotray.contract.extras import extra_required
from spotray.contract.spec import RunContext
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.launch.ray_drain import alive_nodes  # by ID: a node that returns gets a new one
from spotray.train.storage.store import open_store

with extra_required("ray"):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)

MAX_CRASHES_WITHOUT_PROGRESS = 3
# The traceback's tail kept per crash, and so in the run's status message.
MAX_ERROR_CHARS = 2000


def error_tail(error: BaseException, max_chars: int = MAX_ERROR_CHARS) -> str:
    """The last lines of ``error``'s traceback, at most ``max_chars`` (the end is what names the cause)."""
    text = "".join(traceback.format_exception(error)).rstrip()
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3) :]


@dataclass(frozen=True)
class Crash:
    rank: int | None  # None: a worker that died without an exception, whichever it was
    checkpoint_step: int | None  # the newest complete checkpoint when it crashed; None: unknown or none
    error: str
    # Whose it is to fix (cause_of): the training code's, the input's or the infrastructure's.
    cause: Cause = Cause.TRAINING


# What a crash loop of each cause is, in its message.
_WHAT = {
    Cause.TRAINING: "a failure of the training code",
    Cause.BAD_INPUT: "bad input",
    Cause.INFRASTRUCTURE: "an infrastructure fault: the attempt is tried again, spending no budget",
}


@dataclass(frozen=True)
class CrashLoop:
    crashes: int
    checkpoint_step: int | None
    last_error: str
    cause: Cause = Cause.TRAINING  # the last crash's

    @property
    def message(self) -> str:
        if self.cause is Cause.BAD_INPUT and self.crashes == 1:
            return (
                "the job refused its input, and a retry would meet the same input: gave up at the first "
                f"crash instead of retrying. Error:\n{self.last_error}"
            )
        since = f"checkpoint-{self.checkpoint_step}" if self.checkpoint_step is not None else "the start"
        what = _WHAT[self.cause]
        return (
            f"the training code crashed {self.crashes} times with no new checkpoint since {since}; "
            f"gave up instead of retrying for ever ({what}). Last error:\n{self.last_error}"
        )


def crash_loop_verdict(crashes: list[Crash], bound: int = MAX_CRASHES_WITHOUT_PROGRESS) -> CrashLoop | None:
    """A ``CrashLoop`` when the last ``bound`` crashes all saw the same newest checkpoint, or at once
    when the last crash was bad input (a retry meets the same input); else None."""
    if crashes and crashes[-1].cause is Cause.BAD_INPUT:
        last = crashes[-1]
        return CrashLoop(1, last.checkpoint_step, last.error, last.cause)
    if len(crashes) < bound:
        return None
    last = crashes[-1]
    stuck = 0
    for crash in reversed(crashes):
        if crash.checkpoint_step != last.checkpoint_step:
            break
        stuck += 1
    return CrashLoop(stuck, last.checkpoint_step, last.error, last.cause) if stuck >= bound else None


@dataclass(frozen=True)
class GroupStart:
    """What rank 0 saw as its worker group started: the facts that explain the group's silent end."""

    workers: int
    alive_nodes: frozenset[str]  # Ray node IDs


def silent_death(group: int, start: GroupStart, next_start: GroupStart, checkpoint_step: int | None) -> Crash | None:
    """The crash to count for ``group``, which neither raised nor returned before ``next_start``.

    None when it was not the training code's doing: a node alive at its start is gone (its workers
    were lost with it), or the next group has another size (Ray Train stopped it to resize).
    """
    if start.alive_nodes - next_start.alive_nodes or start.workers != next_start.workers:
        return None
    error = (
        f"a worker of group {group} died without raising an exception "
        "(killed by a signal, the OOM killer or a segfault)"
    )
    return Crash(None, checkpoint_step, error, Cause.TRAINING)


class CrashLedger:
    """The attempt's crash records, held by one actor that the driver owns (see the module docstring).

    One record per worker group: when several ranks of a group raise, the first report counts, and
    a group whose end was accounted for (a crash, a return, the next group's start) is not counted again.
    """

    def __init__(self) -> None:
        self.crashes: list[Crash] = []
        self.groups: list[GroupStart] = []  # group N started as groups[N - 1]
        self.groups_ended: set[int] = set()

    def new_group(
        self, *, workers: int, alive_nodes: set[str] | frozenset[str], checkpoint_step: int | None
    ) -> tuple[int, CrashLoop | None]:
        """A number for a worker group that starts, and the verdict it must respect.

        ``checkpoint_step``: the newest complete checkpoint now, which the previous group's silent
        death, if it was one, is counted against.
        """
        start = GroupStart(workers, frozenset(alive_nodes))
        previous = len(self.groups)
        if previous and previous not in self.groups_ended:
            crash = silent_death(previous, self.groups[-1], start, checkpoint_step)
            self.groups_ended.add(previous)
            if crash is not None:
                self.crashes.append(crash)
        self.groups.append(start)
        return len(self.groups), crash_loop_verdict(self.crashes)

    def report(self, group: int, crash: Crash) -> None:
        if group not in self.groups_ended:
            self.groups_ended.add(group)
            self.crashes.append(crash)

    def finished(self, group: int) -> None:
        """The group's loop returned on rank 0: whatever ends the group now, its code did not crash."""
        self.groups_ended.add(group)

    def verdict(self) -> CrashLoop | None:
        return crash_loop_verdict(self.crashes)


def ledger_name(attempt: AttemptId) -> str:
    return f"spotray-crash-ledger-{attempt.run_id}-{attempt.attempt}"


def start_ledger(attempt: AttemptId) -> Any:
    """The driver's ledger actor for this attempt (a handle; it lives as long as the driver).

    It runs on the driver's node. It needs no CPU, so Ray could otherwise place it on any node,
    a spot worker too, and losing that node would lose the ledger with it (the elastic test did).
    The driver's node is the head (on demand) under KubeRay; if it goes, so does the attempt.
    """
    actor = ray.remote(num_cpus=0)(CrashLedger)
    on_driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return actor.options(name=ledger_name(attempt), get_if_exists=True, scheduling_strategy=on_driver_node).remote()


def ledger_verdict(ledger: Any) -> CrashLoop | None:
    """The ledger's verdict after ``fit()``; None (and a warning) when the actor cannot answer."""
    try:
        verdict: CrashLoop | None = ray.get(ledger.verdict.remote(), timeout=30)
    except Exception as error:  # noqa: BLE001 - a lost ledger must not turn a finished fit into a failure
        log.warning("cannot read the crash ledger: %s", error)
        return None
    return verdict


def guard_against_crash_loops(train_loop: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``train_loop`` for Ray Train, with crash reports and the give-up rule (see the module docstring)."""

    @functools.wraps(train_loop)
    def guarded(loop_config: dict[str, Any]) -> None:
        from spotray.train.processes.ranks import (  # noqa: PLC0415 - torch, only in workers
            broadcast_from_rank0,
            world_rank,
            world_size,
        )

        context = RunContext.from_env()
        if context is None:  # launch() always sets it; a loop run some other way is not guarded
            train_loop(loop_config)
            return
        ledger = ray.get_actor(ledger_name(context.attempt_id))
        rank = world_rank()
        group, verdict = 0, cast("CrashLoop | None", None)
        if rank == 0:
            step = _newest_checkpoint_step(context)
            group, verdict = ray.get(
                ledger.new_group.remote(workers=world_size(), alive_nodes=alive_nodes(), checkpoint_step=step)
            )
        group, give_up = broadcast_from_rank0((group, verdict is not None))
        if give_up:
            if verdict is not None:
                log.error("not training: %s", verdict.message)
            return
        try:
            train_loop(loop_config)
        except Exception as error:
            crash = Crash(rank, _newest_checkpoint_step(context), error_tail(error), cause_of(error))
            ray.get(ledger.report.remote(group, crash))
            raise
        if rank == 0:
            try:
                ray.get(ledger.finished.remote(group), timeout=30)
            except Exception as error:  # noqa: BLE001 - the loop's work is done: a lost ledger must not undo it
                log.warning("cannot tell the crash ledger that the loop returned: %s", error)

    return guarded


def _newest_checkpoint_step(context: RunContext) -> int | None:
    try:
        latest = latest_complete_checkpoint(open_store(context.spec.checkpoint.uri))
    except Exception as error:  # noqa: BLE001 - an unreadable store is one of the loops we catch
        log.warning("cannot list checkpoints to record the crash against: %s", error)
        return None
    return latest.step if latest else None
