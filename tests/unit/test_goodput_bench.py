"""bench/goodput.py's legs are TrainingRuns and flags that local mode accepts, as the bench means them."""

import pytest
import yaml

from bench.goodput import fault_args, leg_manifest
from spotray.node_faults import NodeReturn, NodeSchedule
from spotray.train.runspec import WorkerSpec, parse_training_run

pytestmark = pytest.mark.unit


def leg_workers(mode: str) -> WorkerSpec:
    text = leg_manifest(mode, steps=1500, interval=50, low=10, high=500).format(job_dir="/tmp/job")
    return parse_training_run(yaml.safe_load(text)).spec.workers


def test_the_elastic_leg_differs_from_the_fixed_one_only_in_its_size_range() -> None:
    assert (leg_workers("elastic").min_workers, leg_workers("elastic").num_workers) == (1, 2)
    assert not leg_workers("fixed").elastic
    assert not leg_workers("auto").elastic


def test_lost_nodes_become_local_mode_flags_it_accepts_for_both_sizes() -> None:
    faults, flags = fault_args("lose-node", [120, 480], capacity_back_s=90)
    assert faults == []
    assert flags == ("--lose-worker-at", "120,480", "--add-worker-at", "90s")
    schedule = NodeSchedule.from_flags(flags[1], flags[3])
    assert schedule.returns == [NodeReturn(after_s=90.0)] * 2
    for mode in ("elastic", "fixed"):
        NodeSchedule.from_flags(flags[1], flags[3]).check(leg_workers(mode))
    assert fault_args("lose-node", [], 90) == ([], ()), "no preemption drawn: no flags"
    assert [f.step for f in fault_args("kill-worker", [7], 90)[0]] == [7]
