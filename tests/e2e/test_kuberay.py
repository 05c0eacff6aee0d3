"""The real KubeRay operator on the test bed: RayClusters on kwok nodes, RayJobs submitted over
HTTP to a real local Ray head through the Ray bridge, and spot preemption."""

from __future__ import annotations

import json
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.names import SPOT_LABEL
from tests.e2e.conftest import tb

pytestmark = pytest.mark.e2e

RAY_IMAGE = "rayproject/ray:2.60.0"  # never pulled: kwok runs no containers


def ray_cluster_spec(workers: int) -> dict[str, Any]:
    """A head on an on-demand node and `workers` workers on spot nodes."""
    return {
        "rayVersion": "2.60.0",
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "nodeSelector": {SPOT_LABEL: "on-demand"},
                    "containers": [
                        {
                            "name": "ray-head",
                            "image": RAY_IMAGE,
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                        }
                    ],
                }
            },
        },
        "workerGroupSpecs": [
            {
                "groupName": "spot-workers",
                "replicas": workers,
                "minReplicas": 0,
                "maxReplicas": 10,
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "nodeSelector": {SPOT_LABEL: "spot"},
                        "tolerations": [{"key": tb.SPOT_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [
                            {
                                "name": "ray-worker",
                                "image": RAY_IMAGE,
                                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                            }
                        ],
                    }
                },
            }
        ],
    }


def get(testbed: tb.Testbed, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return json.loads(testbed.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)


def ray_pods(testbed: tb.Testbed, namespace: str, cluster: str) -> list[dict[str, Any]]:
    out = testbed.kubectl("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={cluster}", "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def node_kind(testbed: tb.Testbed, node: str) -> str:
    return get(testbed, "node", node, "")["metadata"]["labels"][SPOT_LABEL]


def wait_ray_cluster_ready(testbed: tb.Testbed, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    return tb.wait_until(
        f"RayCluster {name} ready",
        lambda: (c := get(testbed, "raycluster", name, namespace)).get("status", {}).get("state") == "ready" and c,
        timeout=timeout,
    )


def wait_ray_job_finished(testbed: tb.Testbed, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = get(testbed, "rayjob", name, namespace)
        if job.get("status", {}).get("jobDeploymentStatus") in ("Complete", "Failed"):
            return job
        return None

    try:
        return tb.wait_until(f"RayJob {name} to finish", finished, timeout=timeout, interval=1)
    except TimeoutError:
        print(yaml.safe_dump(get(testbed, "rayjob", name, namespace).get("status")))
        print(testbed.log_tail("ray-operator", 40))
        raise


def what_the_job_saw(testbed: tb.Testbed, ray_head: tb.RayHead, namespace: str, name: str) -> str:
    """For a failed assertion: the RayJob's status, the operator's last lines, the Ray head's jobs
    (its dashboard's job list: what each submission became, with Ray's message)."""
    status = yaml.safe_dump(get(testbed, "rayjob", name, namespace).get("status"))
    try:
        with urllib.request.urlopen(f"{ray_head.dashboard_url}/api/jobs/", timeout=5) as answer:
            jobs = answer.read().decode(errors="replace")[-4000:]
    except OSError as error:
        jobs = f"(the dashboard did not answer: {error})"
    return f"RayJob status:\n{status}\nray-operator:\n{testbed.log_tail('ray-operator', 40)}\nRay jobs:\n{jobs}"


def ray_job(name: str, entrypoint: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": entrypoint,
            # The operator itself POSTs the job to the head's dashboard: no submitter pod, which
            # on kwok would never run. The dashboard is the real one, through the bridge.
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": False,
            "rayClusterSpec": ray_cluster_spec(workers=1),
        },
    }


def test_ray_cluster_becomes_ready_with_workers_on_spot_nodes(testbed: tb.Testbed, namespace: str) -> None:
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "demo"}}
    manifest["spec"] = ray_cluster_spec(workers=2)
    testbed.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest))

    cluster = wait_ray_cluster_ready(testbed, namespace, "demo")

    assert cluster["status"]["readyWorkerReplicas"] == 2
    pods = ray_pods(testbed, namespace, "demo")
    by_type = {"head": [], "worker": []}
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        by_type[pod["metadata"]["labels"]["ray.io/node-type"]].append(pod["spec"]["nodeName"])
    assert len(by_type["head"]) == 1
    assert node_kind(testbed, by_type["head"][0]) == "on-demand"
    assert len(by_type["worker"]) == 2
    assert {node_kind(testbed, node) for node in by_type["worker"]} == {"spot"}


def test_bridge_routes_each_head_service_to_its_ray_head(testbed: tb.Testbed, namespace: str) -> None:
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "routed"}}
    manifest["spec"] = ray_cluster_spec(workers=0)
    testbed.apply(manifest, namespace=namespace)
    testbed.bridge(namespace, "routed", "127.0.0.9")

    # The hosts file is the operator's /etc/hosts (see docs/testbed.md, "The Ray bridge").
    line = f"127.0.0.9 routed-head-svc.{namespace}.svc.cluster.local"
    tb.wait_until("the bridge to route the head service", lambda: line in testbed.hosts_file.read_text(), timeout=30)


def test_ray_job_in_http_mode_runs_on_the_local_ray_and_succeeds(
    testbed: tb.Testbed, ray_head: tb.RayHead, namespace: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    entrypoint = f"python -c \"import pathlib; pathlib.Path('{out}').write_text('ran on real ray')\""
    testbed.apply(ray_job("write-file", entrypoint), namespace=namespace)

    job = wait_ray_job_finished(testbed, namespace, "write-file", timeout=120)

    seen = (
        what_the_job_saw(testbed, ray_head, namespace, "write-file")
        if job["status"]["jobDeploymentStatus"] != "Complete"
        else ""
    )
    assert job["status"]["jobDeploymentStatus"] == "Complete", seen
    assert job["status"]["jobStatus"] == "SUCCEEDED"
    assert out.read_text() == "ran on real ray"
    # The status came from the real job: the operator's dashboard URL is the head Service name.
    assert job["status"]["dashboardURL"].endswith(f".{namespace}.svc.cluster.local:8265")


def test_failing_entrypoint_makes_the_ray_job_failed(testbed: tb.Testbed, ray_head: tb.RayHead, namespace: str) -> None:
    testbed.apply(ray_job("fails", "python -c 'import sys; sys.exit(3)'"), namespace=namespace)

    job = wait_ray_job_finished(testbed, namespace, "fails", timeout=120)

    assert job["status"]["jobDeploymentStatus"] == "Failed"
    assert job["status"]["jobStatus"] == "FAILED"


TRAIN_SCRIPT = """
import json, sys

import torch
import ray.train
import ray.train.torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_loop(config):
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    for step in range(1, config["steps"] + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ray.train.report({"step": step, "loss": loss.item()})
    # The worker runs on this machine, so it can leave proof of its work for the test.
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"step": step, "world_size": ray.train.get_context().get_world_size()}, f)


out, storage = sys.argv[1], sys.argv[2]
TorchTrainer(
    train_loop,
    train_loop_config={"steps": 3, "out": out},
    scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
    run_config=RunConfig(name="testbed-train", storage_path=storage),
).fit()
"""


# About 75 s: a campaign (make test-campaign). In make test, the real-pods reclaim test
# (tests/e2e/test_real_pods.py) runs a Ray Train job through KubeRay in real pods.
@pytest.mark.slow
@pytest.mark.campaign
def test_ray_job_runs_a_ray_train_job(
    testbed: tb.Testbed, ray_head: tb.RayHead, namespace: str, tmp_path: Path
) -> None:
    script, out = tmp_path / "train_job.py", tmp_path / "metrics.json"
    script.write_text(textwrap.dedent(TRAIN_SCRIPT))
    testbed.apply(ray_job("train", f"python {script} {out} {tmp_path / 'storage'}"), namespace=namespace)

    job = wait_ray_job_finished(testbed, namespace, "train", timeout=240)

    assert job["status"]["jobStatus"] == "SUCCEEDED", job["status"].get("message")
    assert json.loads(out.read_text()) == {"step": 3, "world_size": 1}


def test_preempting_a_spot_node_makes_kuberay_recreate_its_workers(testbed: tb.Testbed, namespace: str) -> None:
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "spot"}}
    manifest["spec"] = ray_cluster_spec(workers=3)
    testbed.apply(manifest, namespace=namespace)
    wait_ray_cluster_ready(testbed, namespace, "spot")
    workers = {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in ray_pods(testbed, namespace, "spot")
        if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
    }
    victim = next(iter(workers.values()))
    lost = {name for name, node in workers.items() if node == victim}

    evicted = testbed.preempt_node(victim)
    try:
        assert {f"{namespace}/{name}" for name in lost} <= set(evicted)

        def recreated() -> bool:
            now = {
                p["metadata"]["name"]: p
                for p in ray_pods(testbed, namespace, "spot")
                if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
            }
            running = [p for p in now.values() if p["status"].get("phase") == "Running"]
            return not (lost & now.keys()) and len(running) == 3

        tb.wait_until("KubeRay to replace the preempted workers", recreated, timeout=90)
        for pod in ray_pods(testbed, namespace, "spot"):
            assert pod["spec"]["nodeName"] != victim
        wait_ray_cluster_ready(testbed, namespace, "spot")
    finally:
        # Other tests share the session's nodes: the cloud "replaces" the spot capacity.
        testbed.restore_node(victim)


def test_preempting_the_head_node_and_killing_the_job_makes_the_ray_job_failed(
    testbed: tb.Testbed, ray_head: tb.RayHead, namespace: str
) -> None:
    testbed.apply(ray_job("preempted", "python -c 'import time; time.sleep(600)'"), namespace=namespace)
    try:
        running = tb.wait_until(
            "the Ray job to run",
            lambda: (j := get(testbed, "rayjob", "preempted", namespace))["status"].get("jobStatus") == "RUNNING" and j,
            timeout=120,
        )
    except TimeoutError:
        print(what_the_job_saw(testbed, ray_head, namespace, "preempted"))
        raise
    cluster = running["status"]["rayClusterName"]
    pods = ray_pods(testbed, namespace, cluster)
    head_node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "head")

    # The node goes away with the Ray processes on it: the pods through Kubernetes, the job's
    # processes on the real Ray.
    testbed.preempt_node(head_node)
    try:
        assert ray_head.kill_job(running["status"]["jobId"])
        job = wait_ray_job_finished(testbed, namespace, "preempted", timeout=60)
    finally:
        testbed.restore_node(head_node)

    assert job["status"]["jobStatus"] == "FAILED"
    assert job["status"]["jobDeploymentStatus"] == "Failed"
