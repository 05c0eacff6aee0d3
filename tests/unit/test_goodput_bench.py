"""bench/micro/goodput.py's legs are TrainingRuns and flags that local mode accepts, as the bench means them;
bench/micro/demo_goodput.py runs the demo's own faults."""

import random

import pytest
import yaml

from bench.micro.demo_goodput import demo_faults
from bench.micro.goodput import leg_manifest, node_flags, node_lifetimes
from bench.on_testbed.goodput_long import goodput_ratio, leg_timeout_s, reclaim_steps
from bench.on_testbed.goodput_testbed import current_step
from spotray.contract.spec import WorkerSpec, parse_training_run
from spotray.local.node_faults import Moment, NodeSchedule

pytestmark = pytest.mark.unit


def leg_workers(mode: str) -> WorkerSpec:
    text = leg_manifest(mode, steps=1500, interval=50, low=10, high=500).format(job_dir="/tmp/job")
    return parse_training_run(yaml.safe_load(text)).spec.workers


def test_the_elastic_leg_differs_from_the_fixed_one_only_in_its_size_range() -> None:
    assert (leg_workers("elastic").min_workers, leg_workers("elastic").num_workers) == (1, 2)
    assert not leg_workers("fixed").elastic
    assert not leg_workers("auto").elastic


def test_node_lifetimes_become_local_mode_flags_it_accepts_for_both_sizes() -> None:
    lives = node_lifetimes(random.Random(1), mean_s=30.0, total_s=300.0)
    assert sum(lives) >= 300.0
    assert sum(lives[:-1]) < 300.0, "no more lives than the run can use"
    flags = node_flags([95.5, 40.0], capacity_back_s=60)
    assert flags == ("--lose-worker-at", "95.5s,40s", "--add-worker-at", "60s")
    schedule = NodeSchedule.from_flags(flags[1], flags[3])
    assert schedule.losses == [Moment(after_s=95.5), Moment(after_s=40.0)]
    assert schedule.returns == [Moment(after_s=60.0)] * 2
    for mode in ("elastic", "fixed"):
        NodeSchedule.from_flags(flags[1], flags[3]).check(leg_workers(mode))
    assert node_flags([], 60) == (), "no loss drawn: no flags"


def test_the_test_bed_bench_reclaims_only_on_the_running_attempts_own_progress() -> None:
    running = {"rayJob": "run-a2", "attempts": [{"attempt": 1, "endTime": "2026-11-25T00:00:10Z"},
                                                {"attempt": 2, "startTime": "2026-11-25T00:00:20Z"}]}  # fmt: skip
    assert current_step({**running, "progress": {"step": 90, "updateTime": "2026-11-25T00:00:30Z"}}) == 90
    # attempt 1's step 120 is still shown until attempt 2 reports: not the step of the attempt to reclaim
    assert current_step({**running, "progress": {"step": 120, "updateTime": "2026-11-25T00:00:09Z"}}) == -1
    ended = {
        **running,
        "attempts": [{"attempt": 1, "startTime": "2026-11-25T00:00:00Z", "endTime": "2026-11-25T00:01:00Z"}],
    }
    assert current_step({**ended, "progress": {"step": 5, "updateTime": "2026-11-25T00:00:30Z"}}) == -1
    assert current_step({"attempts": [{"attempt": 1, "startTime": "2026-11-25T00:00:00Z"}]}) == -1  # no RayJob yet


def test_the_demo_benchmark_runs_the_faults_make_demo_passes(tmp_path):
    assert demo_faults() == ["--kill-worker-at", "50", "--kill-all-at", "110", "--preempt-at", "150"]
    makefile = tmp_path / "Makefile"
    makefile.write_text("demo: setup\n\tspotray run x --local\n")
    with pytest.raises(SystemExit, match="no `DEMO_FAULTS"):
        demo_faults(makefile)


def test_the_long_run_is_reclaimed_once_every_period_half_a_period_in() -> None:
    steps = 3600  # 30 minutes at 0.5 s a step
    assert reclaim_steps(steps, 0.5, 600) == [600, 1800, 3000], "at 5, 15 and 25 minutes"
    assert reclaim_steps(steps, 0.5, 1800) == [1800], "one period: one reclaim, in its middle"
    assert reclaim_steps(100, 0.5, 600) == [], "a run shorter than half a period is never reclaimed"
    with pytest.raises(ValueError, match="positive"):
        reclaim_steps(steps, 0.0, 600)


def test_the_long_runs_ratio_needs_both_runs_to_succeed_with_a_goodput() -> None:
    done = {"phase": "Succeeded", "goodput": 0.8}
    assert goodput_ratio(done, {"phase": "Succeeded", "goodput": 0.76}) == pytest.approx(0.95)
    assert goodput_ratio(done, {"phase": "Failed", "goodput": 0.5}) is None
    assert goodput_ratio({"phase": "Succeeded", "goodput": None}, done) is None
    assert leg_timeout_s(3600, 0.5, 3) > 3600 * 0.5, "a leg may take longer than its paced steps"
