"""Local mode's lost and returning worker nodes: ``--lose-worker-at`` and ``--add-worker-at``.

A spot pool takes machines away without asking and gives capacity back minutes or hours later. Local
mode plays that with a second Ray node on a loopback address of its own, which holds one worker: at
a step of the user's choosing it is SIGKILLed (raylet and workers at once, a machine vanishing), and
later started again. What the run does meanwhile is the point:

- an elastic run (``spec.workers.minReplicas`` below ``replicas``) goes on with the workers that are
  left, from the latest checkpoint, and grows back once the node returns;
- a fixed-size run waits, training nothing, until the node is back.

A node is lost at a step (``--lose-worker-at 60,400``) or after it has been up some seconds
(``--lose-worker-at 90s``: a spot machine's life is a length of time). It comes back at a step
(``--add-worker-at 300``: only an elastic run trains steps while a node is gone) or some seconds
after its loss (``--add-worker-at 60s``: one delay serves every loss). With ``--worker-notice-s 30``
each loss comes with a spot notice instead: the node is drained as a preemption by the preStop hook
a pod would run (train/launch/drain.py), and stopped with SIGTERM, as the kubelet does, once the
hook returns or the notice runs out; an elastic run takes an emergency checkpoint and goes on
without the node at once.
This module is the schedule, pure and tested; spotray/local/local_run.py starts and kills the nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spotray.contract.errors import SpotrayError
from spotray.contract.spec import WorkerSpec

_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")
# The shortest spot notice local mode plays: the drain, a checkpoint and its upload must fit in it.
MIN_NOTICE_S = 5


@dataclass(frozen=True)
class Moment:
    """When a node fault happens: at a training step, or a number of seconds after something.

    For a loss, the seconds count from when the node came up (started, or came back); for a return,
    from the loss. Seconds make a node's life a length of time, as a spot machine's is.
    """

    step: int | None = None
    after_s: float | None = None

    @classmethod
    def parse(cls, text: str, flag: str) -> Moment:
        text = text.strip()
        if text.isdigit() and int(text) > 0:
            return cls(step=int(text))
        seconds = _SECONDS.match(text)
        if seconds:
            return cls(after_s=float(seconds.group(1)))
        raise SpotrayError(
            f"{flag} {text!r} is neither a step nor a number of seconds",
            f"give steps (e.g. {flag} 60,300) or seconds (e.g. {flag} 90s)",
        )

    def due(self, step: int, elapsed_s: float) -> bool:
        if self.step is not None:
            return step >= self.step
        assert self.after_s is not None
        return elapsed_s >= self.after_s

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.after_s:g} s"


def parse_moments(text: str | None, flag: str) -> list[Moment]:
    """``"120,400"`` or ``"90s,60s"`` -> the moments, in order."""
    return [Moment.parse(part, flag) for part in text.split(",")] if text else []


@dataclass(frozen=True)
class NodeLayout:
    """The local Ray cluster of a run with node faults: the head holds all workers but one, the lost node one."""

    head_cpus: int
    node_cpus: int


@dataclass
class NodeSchedule:
    """The losses and returns still to come, and whether the worker node is gone now."""

    losses: list[Moment]
    returns: list[Moment] = field(default_factory=list)
    notice_s: int = 0  # each loss announced this many seconds ahead (a spot notice); 0: the node vanishes
    up_since: float = 0.0  # monotonic time the node came up (started, or came back)
    lost_since: float | None = None  # monotonic time of the current loss; None while the node is up

    @classmethod
    def from_flags(
        cls, lose_worker_at: str | None, add_worker_at: str | None, worker_notice_s: int | None = None
    ) -> NodeSchedule:
        """The schedule of ``--lose-worker-at 120,400 --add-worker-at 60s``; one delay serves every loss."""
        losses = parse_moments(lose_worker_at, "--lose-worker-at")
        returns = parse_moments(add_worker_at, "--add-worker-at")
        if len(returns) == 1 and returns[0].after_s is not None:
            returns = returns * max(1, len(losses))
        if worker_notice_s is not None and worker_notice_s < MIN_NOTICE_S:
            raise SpotrayError(
                f"--worker-notice-s {worker_notice_s} leaves no time for an emergency checkpoint",
                f"give at least {MIN_NOTICE_S} seconds (GKE gives 30, AWS 120)",
            )
        return cls(losses, returns, notice_s=worker_notice_s or 0)

    def check(self, workers: WorkerSpec) -> NodeLayout:
        """Refuse a schedule the run could not live through, naming the fix; else the cluster layout."""
        if not self.losses:
            if self.returns or self.notice_s:
                flag = "--add-worker-at" if self.returns else "--worker-notice-s"
                raise SpotrayError(f"{flag} without --lose-worker-at", "lose a node first: --lose-worker-at N")
            return NodeLayout(0, 0)
        if workers.num_workers < 2:
            raise SpotrayError(
                f"--lose-worker-at needs at least 2 workers; spec.workers.replicas is {workers.num_workers}",
                "set spec.workers.replicas: 2 or more (and minReplicas below it for an elastic run)",
            )
        per_worker = workers.cpu_per_worker
        # Ray nodes have whole CPUs; a fraction would let a node hold more workers than meant.
        if not per_worker.is_integer():
            raise SpotrayError(
                f"--lose-worker-at puts one worker on a node of its own, but {per_worker:g} CPU per worker "
                "does not split into whole-CPU Ray nodes",
                'use a whole number of CPUs per worker (spec.workers.cpu: "1") for a local run with node faults',
            )
        if len(self.returns) > len(self.losses):
            raise SpotrayError(
                f"{len(self.returns)} returns (--add-worker-at) for {len(self.losses)} losses (--lose-worker-at)",
                "give at most one return per loss, or one delay in seconds (60s) for all of them",
            )
        if len(self.returns) < len(self.losses) - 1:
            raise SpotrayError(
                "a node is lost again before it came back: every loss but the last needs its return",
                "give a return for each loss (--add-worker-at 150,450), or one delay for all (--add-worker-at 60s)",
            )
        if not workers.elastic and len(self.returns) < len(self.losses):
            raise SpotrayError(
                "a fixed-size run waits for its lost node, and this one never comes back",
                "add --add-worker-at 60s (the node returns a minute after its loss), or set "
                "spec.workers.minReplicas below replicas to go on without it",
            )
        if not workers.elastic and any(back.step is not None for back in self.returns):
            raise SpotrayError(
                "a fixed-size run trains no step while its node is gone, so it cannot come back at a step",
                "give seconds after the loss (--add-worker-at 60s), or make the run elastic (minReplicas)",
            )
        sequence = [moment for pair in zip(self.losses, self.returns, strict=False) for moment in pair]
        marks = [moment.step for moment in sequence + self.losses[len(self.returns) :] if moment.step is not None]
        if marks != sorted(set(marks)):
            raise SpotrayError(
                f"losses at {', '.join(map(str, self.losses))} and returns at {', '.join(map(str, self.returns))} "
                "do not alternate",
                "each return's step comes after its loss and before the next loss",
            )
        return NodeLayout(head_cpus=(workers.num_workers - 1) * int(per_worker), node_cpus=int(per_worker))

    def loss_due(self, step: int, now: float) -> bool:
        return self.lost_since is None and bool(self.losses) and self.losses[0].due(step, now - self.up_since)

    def return_due(self, step: int, now: float) -> bool:
        return self.lost_since is not None and bool(self.returns) and self.returns[0].due(step, now - self.lost_since)

    def lost(self, now: float) -> None:
        self.losses.pop(0)
        self.lost_since = now

    def returned(self, now: float) -> None:
        self.returns.pop(0)
        self.lost_since, self.up_since = None, now

    def new_cluster(self, now: float) -> None:
        """A new attempt starts a new cluster, with every node: a loss waiting for its return is over."""
        if self.lost_since is not None:
            self.returned(now)
        self.up_since = now
