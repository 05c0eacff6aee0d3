"""Elastic worker counts: the spec's range, and one global batch at every size of it."""

import argparse
from typing import Any

import pytest

from spotray.contract.errors import SpotrayError
from spotray.contract.spec import InvalidSpecError, WorkerSpec, parse_spec
from spotray.jobs.common import add_run_flags, run_context
from spotray.train.launch.batching import BatchPlan, check_batch_splits, plan_batch

pytestmark = pytest.mark.unit


def spec_with(**workers: Any) -> dict[str, Any]:
    return {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bucket/run"}, "workers": workers}


def test_min_replicas_defaults_to_a_fixed_size_and_makes_a_range_below_replicas() -> None:
    fixed = parse_spec(spec_with(replicas=3)).workers
    assert (fixed.min_workers, fixed.num_workers, fixed.elastic) == (3, 3, False)
    gpus = parse_spec(spec_with(replicas=4, minReplicas=2, gpu=2)).workers
    assert (gpus.min_workers, gpus.num_workers, gpus.elastic) == (4, 8, True)
    assert list(gpus.worker_counts) == [4, 6, 8], "whole pods come and go, each with its GPUs"


@pytest.mark.parametrize(
    ("workers", "problem"),
    [
        ({"replicas": 2, "minReplicas": 3}, "spec.workers.minReplicas: must be <= replicas (2), got 3"),
        ({"replicas": 2, "minReplicas": 0}, "spec.workers.minReplicas: must be >= 1, got 0"),
        ({"replicas": 2, "minReplicas": "one"}, "spec.workers.minReplicas: must be an integer, got 'one'"),
    ],
)
def test_a_bad_range_is_refused_with_the_field(workers: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with(**workers))
    assert problem in str(caught.value)


def test_a_batch_some_worker_count_cannot_split_is_refused_naming_the_counts() -> None:
    check_batch_splits(12, WorkerSpec(replicas=4, min_replicas=2))  # 2, 3 and 4 all divide 12
    with pytest.raises(SpotrayError) as caught:
        check_batch_splits(16, WorkerSpec(replicas=4, min_replicas=2))
    assert "--batch-size 16 does not split evenly over 3 workers" in str(caught.value)
    assert "2 to 4" in str(caught.value)
    assert "minReplicas" in caught.value.fix


@pytest.mark.parametrize(
    ("global_batch", "world_size", "max_world_size", "expected"),
    [
        (16, 4, 4, BatchPlan(per_device=4, accumulation=1, world_size=4)),  # full size: as before
        (16, 2, 4, BatchPlan(per_device=4, accumulation=2, world_size=2)),  # half the workers, two passes
        (16, 1, 4, BatchPlan(per_device=4, accumulation=4, world_size=1)),
        (12, 3, 4, BatchPlan(per_device=2, accumulation=2, world_size=3)),  # 4 a worker; at most 3 a pass
        (12, 2, 3, BatchPlan(per_device=3, accumulation=2, world_size=2)),
        (8, 1, 1, BatchPlan(per_device=8, accumulation=1, world_size=1)),
    ],
)
def test_every_size_takes_the_global_batch_in_passes_no_bigger_than_at_full_size(
    global_batch: int, world_size: int, max_world_size: int, expected: BatchPlan
) -> None:
    plan = plan_batch(global_batch, world_size, max_world_size)
    assert plan == expected
    assert plan.global_batch == global_batch
    assert plan.per_device <= global_batch // max_world_size


def test_a_size_that_cannot_split_the_batch_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="cannot split 16 samples over 3 of 4 workers"):
        plan_batch(16, 3, 4)


def test_a_job_started_by_hand_takes_min_workers_from_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTRAY_RUN", raising=False)
    parser = argparse.ArgumentParser()
    add_run_flags(parser, run_name="gpt2", data_help="data")
    args = parser.parse_args(["--checkpoint-uri", "s3://bucket/run", "--workers", "3", "--min-workers", "1"])
    workers = run_context(args).spec.workers
    assert (workers.min_workers, workers.num_workers, workers.elastic) == (1, 3, True)
    assert not run_context(parser.parse_args(["--checkpoint-uri", "s3://bucket/run"])).spec.workers.elastic
    with pytest.raises(SpotrayError) as caught:
        run_context(parser.parse_args(["--checkpoint-uri", "s3://bucket/run", "--workers", "2", "--min-workers", "3"]))
    assert "--min-workers 3 is outside 1..--workers (2)" in str(caught.value)
