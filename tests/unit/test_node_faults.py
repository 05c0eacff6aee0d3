"""Local mode's node loss schedule: the flags, what a run could not live through, and when each move is due."""

import time

import pytest

from spotray.cli.main import main
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import WorkerSpec
from spotray.local.local_run import start_worker_node
from spotray.local.node_faults import Moment, NodeLayout, NodeSchedule

pytestmark = pytest.mark.unit

ELASTIC = WorkerSpec(replicas=2, min_replicas=1, cpu="1")
FIXED = WorkerSpec(replicas=2, cpu="1")


def test_a_moment_is_a_step_or_seconds() -> None:
    assert Moment.parse("300", "--add-worker-at") == Moment(step=300)
    assert Moment.parse("90s", "--add-worker-at") == Moment(after_s=90.0)
    assert Moment.parse("1.5s", "--add-worker-at").due(step=0, elapsed_s=1.5)
    assert not Moment.parse("300", "--add-worker-at").due(step=299, elapsed_s=1e6)
    for text in ("90m", "0", "-5", "sixty"):
        with pytest.raises(SpotrayError, match="neither a step nor a number of seconds"):
            Moment.parse(text, "--lose-worker-at")


def test_one_delay_serves_every_loss_and_steps_pair_up_in_order() -> None:
    assert NodeSchedule.from_flags("60,300", "90s").returns == [Moment(after_s=90.0)] * 2
    schedule = NodeSchedule.from_flags("60,300", "150")
    assert schedule.check(ELASTIC) == NodeLayout(head_cpus=1, node_cpus=1)
    assert NodeSchedule.from_flags(None, None).check(FIXED) == NodeLayout(0, 0), "no faults: no second node"


def test_the_head_holds_every_worker_but_the_one_on_the_node() -> None:
    workers = WorkerSpec(replicas=4, min_replicas=2, cpu="2")
    assert NodeSchedule.from_flags("10", None).check(workers) == NodeLayout(head_cpus=6, node_cpus=2)


@pytest.mark.parametrize(
    ("lose", "add", "workers", "problem"),
    [
        ("60", None, FIXED, "waits for its lost node, and this one never comes back"),
        ("60", "120", FIXED, "trains no step while its node is gone"),
        ("60,300", None, ELASTIC, "lost again before it came back"),
        ("60", "30", ELASTIC, "do not alternate"),
        ("60,100", "200,400", ELASTIC, "do not alternate"),
        ("60", "100,200", ELASTIC, "2 returns"),
        (None, "60s", ELASTIC, "without --lose-worker-at"),
        ("60", "60s", WorkerSpec(replicas=1), "at least 2 workers"),
        ("60", "60s", WorkerSpec(replicas=3, cpu="500m"), "whole-CPU"),
        ("60,30", "60s", ELASTIC, "do not alternate"),
        ("60,60", "60s", ELASTIC, "do not alternate"),
    ],
)
def test_a_schedule_the_run_cannot_live_through_is_refused_with_the_fix(
    lose: str | None, add: str | None, workers: WorkerSpec, problem: str
) -> None:
    with pytest.raises(SpotrayError, match=problem) as refused:
        NodeSchedule.from_flags(lose, add).check(workers)
    assert refused.value.fix


def test_losses_and_returns_come_due_in_turn() -> None:
    schedule = NodeSchedule.from_flags("60,300", "100,400")
    schedule.check(ELASTIC)
    assert not schedule.loss_due(59, now=1e6)
    assert schedule.loss_due(60, now=0.0)
    schedule.lost(now=10.0)
    assert not schedule.loss_due(300, now=10.0), "a node that is gone cannot be lost again"
    assert not schedule.return_due(99, now=1e6)
    assert schedule.return_due(100, now=11.0)
    schedule.returned(now=11.0)
    assert schedule.loss_due(300, now=11.0)
    schedule.lost(now=20.0)
    schedule.new_cluster(now=30.0)  # a new attempt brings every node back
    assert schedule.lost_since is None
    assert schedule.losses == []
    assert schedule.returns == []


def test_a_return_counts_seconds_from_its_loss_and_a_loss_from_the_node_coming_up() -> None:
    schedule = NodeSchedule.from_flags("90s,90s", "30s")
    schedule.new_cluster(now=100.0)
    assert not schedule.loss_due(step=10_000, now=189.9)
    assert schedule.loss_due(step=0, now=190.0)
    schedule.lost(now=190.0)
    assert not schedule.return_due(step=10_000, now=219.9)
    assert schedule.return_due(step=0, now=220.0)
    schedule.returned(now=225.0)
    assert not schedule.loss_due(step=10_000, now=314.9), "the node's new life starts when it is back"
    assert schedule.loss_due(step=0, now=315.0)


def test_fault_flags_without_local_are_refused_not_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "jobs/gpt2/trainingrun.yaml", "--lose-worker-at", "60"]) == 2
    assert "--lose-worker-at injects faults into a local run" in capsys.readouterr().err


class SlowToStartCluster:
    """Stands in for LocalRayCluster: starting a Ray node takes seconds (here 0.3 s)."""

    def add_worker_node(self, cpus: int) -> str:
        time.sleep(0.3)
        self.started_at = time.monotonic()
        return f"node with {cpus} cpus"


def test_a_loss_in_seconds_counts_from_when_the_attempts_node_is_up_not_from_before_its_start() -> None:
    schedule = NodeSchedule.from_flags("1s", None)
    cluster = SlowToStartCluster()
    assert start_worker_node(cluster, 1, schedule) == "node with 1 cpus"  # type: ignore[arg-type]
    assert schedule.up_since >= cluster.started_at


def test_a_notice_needs_a_loss_and_time_for_a_checkpoint() -> None:
    with pytest.raises(SpotrayError, match="without --lose-worker-at") as refused:
        NodeSchedule.from_flags(None, None, worker_notice_s=30).check(ELASTIC)
    assert refused.value.fix
    with pytest.raises(SpotrayError, match="no time for an emergency checkpoint") as refused:
        NodeSchedule.from_flags("60", None, worker_notice_s=2)
    assert "at least 5 seconds" in refused.value.fix
    assert NodeSchedule.from_flags("60", None, worker_notice_s=30).notice_s == 30
    assert NodeSchedule.from_flags("60", None).notice_s == 0, "without the flag a node vanishes"
