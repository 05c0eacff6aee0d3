"""Local mode uses the machine's GPUs when it has them (issue #72, item 6): a manifest whose workers ask
for GPUs runs when PyTorch sees that many, its Ray head offering them to Ray Train's workers, and is
refused with the numbers when it does not. Node faults and sweeps stay on CPU, and say so.

The machine here has no GPU: PyTorch's count is replaced; what runs on a real GPU is the same job
with use_gpu (jobs/gpt2/train.py), unverified here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotray.contract.errors import SpotrayError
from spotray.contract.spec import parse_training_run
from spotray.local import local_run as local
from spotray.local.local_run import Faults, LocalRun, local_gpus
from spotray.local.node_faults import NodeSchedule
from spotray.local.progress import ProgressView
from tests.unit.test_local_cluster_reuse import STARTED, StandInCluster

pytestmark = pytest.mark.unit


def manifest(gpu: int, replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "gpus"},
        "spec": {
            "entrypoint": "true",
            "checkpoint": {"uri": "s3://bucket/runs/gpus"},
            "workers": {"gpu": gpu, "replicas": replicas},
        },
    }


def test_the_gpus_asked_are_given_when_the_machine_has_them_and_refused_with_the_numbers_when_not() -> None:
    workers = parse_training_run(manifest(gpu=2)).spec.workers
    assert local_gpus(workers, "spec.workers.gpu", available=4) == 4, "2 per pod, 2 pods"
    with pytest.raises(SpotrayError) as caught:
        local_gpus(workers, "spec.workers.gpu", available=1)
    assert "4 GPUs in all, but this machine has 1 (torch.cuda.device_count())" in str(caught.value)
    assert "set spec.workers.gpu: 0 to train on CPU here" in str(caught.value)
    assert local_gpus(parse_training_run(manifest(gpu=0)).spec.workers, "spec.workers.gpu", available=0) == 0
    with pytest.raises(SpotrayError, match="local sweeps train on CPU"):
        local_gpus(workers, "spec.template.workers.gpu", 8, why_cpu="local sweeps train on CPU")


def test_a_local_run_offers_its_gpus_to_ray_on_the_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    STARTED.clear()
    monkeypatch.setattr(local, "LocalRayCluster", StandInCluster)
    monkeypatch.setattr(local, "machine_gpus", lambda: 2)
    run = LocalRun(parse_training_run(manifest(gpu=1)), tmp_path, Faults(), progress=ProgressView())
    cluster, _ = run._cluster_for(1)
    assert cluster.num_gpus == 2  # type: ignore[attr-defined]
    cpu = LocalRun(parse_training_run(manifest(gpu=0)), tmp_path / "cpu", Faults(), progress=ProgressView())
    assert cpu._cluster_for(1)[0].num_gpus == 0  # type: ignore[attr-defined]
    lost = Faults(nodes=NodeSchedule.from_flags("60", None))
    with pytest.raises(SpotrayError, match="runs with node faults train on CPU here"):
        LocalRun(parse_training_run(manifest(gpu=1)), tmp_path / "lost", lost, progress=ProgressView())
