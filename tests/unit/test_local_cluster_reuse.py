"""Local mode runs the next attempt on the Ray cluster the last one left standing and undrained (issue 39, item 5).

Ray itself is replaced here by a stand-in that says whether its head still runs: what is decided is
which cluster an attempt gets. That Ray frees a finished driver's CPUs for the next driver is shown
by the real runs (tests/integration/test_attempt_contract.py, test_demo.py) and measured in
bench/micro/local_recovery.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.common import goal_met
from bench.micro.local_recovery import GOAL, attempt_phases
from spotray.cli.main import main
from spotray.contract.spec import parse_training_run
from spotray.local import local_run as local
from spotray.local.local_run import Faults, LocalRun
from spotray.local.progress import ProgressView

pytestmark = pytest.mark.unit


@dataclass
class StandInCluster:
    num_cpus: int
    num_gpus: int = 0
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    on_launch: Any = None
    up: bool = False
    stops: int = 0

    address = "127.0.0.2:6379"

    def start(self) -> StandInCluster:
        self.up = True
        STARTED.append(self)
        return self

    def standing(self) -> bool:
        return self.up

    def stop(self) -> None:
        self.up, self.stops = False, self.stops + 1


STARTED: list[StandInCluster] = []


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalRun:
    STARTED.clear()
    monkeypatch.setattr(local, "LocalRayCluster", StandInCluster)
    document = {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "reuse"},
        "spec": {"entrypoint": "true", "checkpoint": {"uri": "s3://bucket/runs/reuse"}, "workers": {"gpu": 0}},
    }
    return LocalRun(parse_training_run(document), tmp_path, Faults(), progress=ProgressView())


def test_the_next_attempt_gets_the_cluster_still_standing(run: LocalRun) -> None:
    first, kept = run._cluster_for(1)
    assert not kept
    assert run._cluster_for(2) == (first, True)
    assert len(STARTED) == 1, "a notice or a failed driver leaves the head up: no second `ray start`"


def test_a_cluster_whose_head_is_gone_is_cleaned_up_and_replaced(run: LocalRun) -> None:
    first, _ = run._cluster_for(1)
    first.up = False  # --kill-all-at: the head SIGKILLed
    second, kept = run._cluster_for(2)
    assert not kept
    assert second is not first
    assert second.standing()
    assert first.stops == 1, "what the lost one left (its temp dir) is removed"


def test_a_cluster_a_notice_drained_is_not_kept(run: LocalRun) -> None:
    first, _ = run._cluster_for(1)
    run.cluster_drained = True  # the driver got SIGTERM: it drained every node for preemption
    second, kept = run._cluster_for(2)
    assert not kept
    assert second is not first
    assert first.stops == 1
    assert not run.cluster_drained, "the new cluster is not drained"


def test_the_run_ends_by_stopping_the_cluster_it_kept(run: LocalRun) -> None:
    cluster, _ = run._cluster_for(1)
    run._stop_cluster()
    assert (cluster.stops, run.cluster) == (1, None)


def test_without_reuse_every_attempt_starts_a_cluster_of_its_own(run: LocalRun) -> None:
    run.keep_ray_cluster = False
    first, _ = run._cluster_for(1)
    run._stop_cluster()  # what _one_attempt does at the end of each attempt then
    assert run._cluster_for(2) == (STARTED[1], False)
    assert STARTED[1] is not first
    assert len(STARTED) == 2


def test_fresh_ray_cluster_without_local_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "jobs/gpt2/trainingrun.yaml", "--fresh-ray-cluster"]) == 2
    assert "--fresh-ray-cluster chooses local mode's Ray cluster" in capsys.readouterr().err


def test_the_benchmark_splits_each_restart_into_its_phases() -> None:
    def event(kind: str, at: float, **fields: Any) -> dict[str, Any]:
        return {"event": kind, "time": at, **fields}

    log = [
        event("attempt_begun", 0.0, attempt=1, ray_cluster="new", ray_start_s=5.0),
        event("worker_start", 12.0),
        event("start", 14.0, attempt=1),
        event("step", 15.0, step=1),
        event("step", 16.0, step=2),  # the notice: attempt 1 ends after this step
        event("attempt_begun", 20.0, attempt=2, ray_cluster="kept", ray_start_s=0.0),
        event("driver_start", 22.0),
        event("ray_connected", 23.0),
        event("worker_group_asked", 23.5),
        event("worker_start", 27.0),
        event("worker_start", 27.5),  # the second rank: the group was up at the first
        event("start", 30.0, attempt=2),
        event("step", 31.5, step=3),
        event("step", 32.0, step=4),
    ]
    # A new cluster for attempt 3: attempt_begun is written once it is up, 6 s after the attempt began.
    log += [
        event("attempt_begun", 46.0, attempt=3, ray_cluster="new", ray_start_s=6.0),
        event("driver_start", 49.0),
        event("worker_start", 55.0),
        event("start", 56.0, attempt=3),
        event("step", 57.0, step=5),
    ]
    fresh = attempt_phases(log)[1]
    assert (fresh["ray_start_s"], fresh["driver_imports_s"], fresh["driver_to_workers_up_s"]) == (6.0, 3.0, 9.0)
    assert fresh["begun_to_first_step_s"] == 17.0, "Ray's start counts: the attempt began at 40"
    assert attempt_phases(log)[0] == {
        "attempt": 2,
        "ray_cluster": "kept",
        "ray_start_s": 0.0,
        "driver_to_workers_up_s": 7.0,
        "driver_imports_s": 2.0,
        "ray_connect_s": 1.0,
        "driver_setup_s": 0.5,
        "worker_group_s": 3.5,
        "workers_up_to_loop_s": 3.0,
        "loop_to_first_step_s": 1.5,
        "begun_to_first_step_s": 11.5,
        "last_step_to_first_step_s": 15.5,
    }


def test_the_benchmarks_goal_is_one_its_result_file_can_be_judged_by() -> None:
    assert goal_met(0.8, GOAL)
    assert not goal_met(1.0, GOAL)
