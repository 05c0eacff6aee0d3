"""Per-run placement (issue 71): spec.head and spec.workers say where their pods go and what they
carry, checked by the parser as Kubernetes would, and laid over the chart's defaults in the RayJob
and the kept RayCluster. tests/data/controller/cloud-placement.* is the whole RayJob of one such run;
tests/e2e/test_crd_validation.py checks that the API server refuses what the parser refuses."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from spotray.contract.spec import InvalidSpecError, encode_spec, parse_spec
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_ray_cluster, build_rayjob, ray_cluster_shape
from tests.lifecycle_runs import run

pytestmark = pytest.mark.unit


def pods(built: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's and the workers' pod templates of a RayJob or a RayCluster."""
    cluster = built["spec"].get("rayClusterSpec") or built["spec"]
    return cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]


def test_a_runs_placement_is_laid_over_the_charts() -> None:
    placed = run(
        workers={
            "gpu": 8,
            "nodeSelector": {"nvidia.com/gpu.product": "H100", "spotray.dev/capacity": "spot-h100"},
            "tolerations": [{"key": "team/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "labels": {"team": "a"},
        },
        head={"annotations": {"note": "x"}},
    )
    head, worker = pods(build_rayjob(placed, 1, "uid", ControllerConfig()))
    assert worker["spec"]["nodeSelector"] == {"spotray.dev/capacity": "spot-h100", "nvidia.com/gpu.product": "H100"}
    assert worker["spec"]["tolerations"] == [
        {"key": "spotray.dev/spot", "operator": "Exists", "effect": "NoSchedule"},  # the chart's stays
        {"key": "team/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert worker["metadata"]["labels"]["team"] == "a"
    assert worker["metadata"]["labels"]["spotray.dev/run"] == "r", "spotray's labels stay"
    assert head["metadata"]["annotations"] == {"note": "x"}
    assert "annotations" not in worker["metadata"]
    assert head["spec"]["nodeSelector"] == {"spotray.dev/capacity": "on-demand"}


def test_the_charts_defaults_apply_where_the_run_says_nothing_and_yield_where_it_does() -> None:
    config = ControllerConfig(
        gpu_resource="amd.com/gpu", ray_service_account="ray-pods", ray_priority_class="batch", ray_shm_size="1Gi"
    )
    plain = run(workers={"gpu": 2})
    head, worker = pods(build_rayjob(plain, 1, "uid", config))
    assert worker["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == 2
    for pod in (head, worker):
        assert pod["spec"]["serviceAccountName"] == "ray-pods"
        assert pod["spec"]["priorityClassName"] == "batch"
        assert pod["spec"]["automountServiceAccountToken"] is False, "an identity, never an API token"
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["spec"]["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]
    own = run(
        workers={"gpu": 2, "gpuResource": "nvidia.com/mig-1g.10gb", "serviceAccountName": "mine", "shmSize": "8Gi"}
    )
    _, worker = pods(build_rayjob(own, 1, "uid", config))
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == 2
    assert "amd.com/gpu" not in worker["spec"]["containers"][0]["resources"]["limits"]
    assert worker["spec"]["serviceAccountName"] == "mine"
    assert worker["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]


def test_nothing_placed_leaves_the_pods_as_before() -> None:
    head, worker = pods(build_rayjob(run(), 1, "uid", ControllerConfig()))
    for pod in (head, worker):
        assert not {"serviceAccountName", "priorityClassName", "volumes", "affinity"} & set(pod["spec"])
        assert "volumeMounts" not in pod["spec"]["containers"][0]


def test_the_workers_spread_joins_the_runs_own_anti_affinity() -> None:
    own_term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
    affinity = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own_term]},
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    spared = run(workers={"spareReplicas": 1, "affinity": affinity})
    _, worker = pods(build_rayjob(spared, 1, "uid", ControllerConfig()))
    anti = worker["spec"]["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"] == [own_term]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    assert worker["spec"]["affinity"]["nodeAffinity"] == affinity["nodeAffinity"]
    assert spared.spec.workers.affinity == affinity, "the run's own declaration is never changed"


def test_the_kept_cluster_carries_the_placement_and_a_new_placement_is_a_new_shape() -> None:
    placed = run(workers={"nodeSelector": {"zone": "a"}})
    _, worker = pods(build_ray_cluster(placed, "r-c1", "uid", ControllerConfig()))
    assert worker["spec"]["nodeSelector"]["zone"] == "a"
    moved = run(workers={"nodeSelector": {"zone": "b"}})
    assert ray_cluster_shape(placed, ControllerConfig()) != ray_cluster_shape(moved, ControllerConfig())


def test_placement_round_trips_through_the_jobs_encoded_spec() -> None:
    placed = run(
        workers={"tolerations": [{"operator": "Exists"}], "nodeSelector": {"a": "b"}, "shmSize": "2Gi"},
        head={"priorityClassName": "high"},
    ).spec
    assert parse_spec(encode_spec(placed)) == placed
    assert "workers" not in encode_spec(run().spec), "unset fields and default sections stay out, for older jobs"
    assert encode_spec(placed)["workers"]["tolerations"] == [{"operator": "Exists"}]


@pytest.mark.parametrize(
    ("workers", "says"),
    [
        ({"labels": {"spotray.dev/run": "x"}}, "spec.workers.labels.spotray.dev/run: the key must not start with"),
        ({"labels": {"team": "a b"}}, "spec.workers.labels.team: the value must be at most 63"),
        ({"nodeSelector": {"zone": 5}}, "spec.workers.nodeSelector.zone: the value must be a string"),
        ({"annotations": {"bad key": "x"}}, "spec.workers.annotations.bad key: the key must be a qualified name"),
        ({"tolerations": {"key": "x"}}, "spec.workers.tolerations: must be a list"),
        ({"tolerations": [{"key": "x", "operator": "Maybe"}]}, "spec.workers.tolerations[0].operator: must be one"),
        ({"tolerations": [{"value": "x"}]}, "spec.workers.tolerations[0].key: missing"),
        ({"tolerations": [{"key": "x", "operator": "Exists", "value": "y"}]}, "tolerations[0].value: must be"),
        ({"tolerations": [{"key": "x", "tolerationSeconds": "5"}]}, "tolerations[0].tolerationSeconds: must be"),
        ({"tolerations": [{"key": "x", "effect": "Never"}]}, "spec.workers.tolerations[0].effect: must be one of"),
        ({"serviceAccountName": "Trainer"}, "spec.workers.serviceAccountName: must be a DNS subdomain"),
        ({"gpuResource": "gpu!"}, "spec.workers.gpuResource: must be a qualified name"),
        ({"shmSize": "a lot"}, "spec.workers.shmSize: 'a lot' is not a memory quantity"),
        ({"affinity": ["x"]}, "spec.workers.affinity: must be a mapping"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "spec.workers.labels: at most 64 entries"),
    ],
)
def test_placement_that_kubernetes_would_refuse_is_refused_with_its_path(workers: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        run(workers=workers)
    assert any(says in problem for problem in refused.value.problems), refused.value.problems


def test_the_gpu_resource_is_the_charts_unless_the_run_names_one() -> None:
    assert run().spec.workers.gpu_resource is None
    assert replace(ControllerConfig(), gpu_resource="x").gpu_resource == "x"
    assert ControllerConfig.from_env({"SPOTRAY_GPU_RESOURCE": "amd.com/gpu"}).gpu_resource == "amd.com/gpu"
    assert ControllerConfig.from_env({}).gpu_resource == "nvidia.com/gpu"
    assert ControllerConfig.from_env({"SPOTRAY_RAY_SHM_SIZE": "4Gi"}).ray_shm_size == "4Gi"
