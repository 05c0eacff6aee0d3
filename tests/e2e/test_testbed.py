"""The test bed itself: pinned binaries, kwok nodes, pods driven by kwok stages, clean teardown."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, CoreV1Api

from spotray.contract.names import SPOT_LABEL
from tests.e2e.conftest import tb

pytestmark = pytest.mark.e2e


def test_binaries_report_the_pinned_versions(testbed: tb.Testbed) -> None:
    versions = tb.versions()
    server = json.loads(testbed.kubectl("version", "-o", "json").stdout)
    assert server["serverVersion"]["gitVersion"] == versions["KUBERNETES_VERSION"]
    assert server["clientVersion"]["gitVersion"] == versions["KUBERNETES_VERSION"]
    helm = subprocess.run([str(tb.binary("helm")), "version", "--short"], capture_output=True, text=True, check=True)
    assert helm.stdout.startswith(versions["HELM_VERSION"])


def test_nodes_are_labelled_tainted_and_sized(kube_api: ApiClient) -> None:
    items = kube_api.sanitize_for_serialization(CoreV1Api(kube_api).list_node().items)
    nodes = {n["metadata"]["name"]: n for n in items}
    spot = {name for name, n in nodes.items() if n["metadata"]["labels"].get(SPOT_LABEL) == "spot"}
    on_demand = {name for name, n in nodes.items() if n["metadata"]["labels"].get(SPOT_LABEL) == "on-demand"}
    assert len(spot) >= 3
    assert len(on_demand) >= 2
    for name in spot:
        assert tb.SPOT_TAINT["key"] in {t["key"] for t in nodes[name]["spec"]["taints"]}
    for name in on_demand:
        assert not nodes[name]["spec"].get("taints")
    gpus = {name: n["status"]["allocatable"].get("nvidia.com/gpu") for name, n in nodes.items()}
    assert gpus["spot-gpu-0"] == "8"
    assert gpus["ondemand-gpu-0"] == "4"


def test_pods_run_and_job_pods_succeed_on_kwok_nodes(testbed: tb.Testbed, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "hello"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {SPOT_LABEL: "spot"},
                    "tolerations": [{"key": tb.SPOT_TAINT["key"], "operator": "Exists"}],
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                }
            }
        },
    }
    testbed.apply(job, namespace=namespace)
    testbed.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/hello", "--timeout=60s")
    pod = json.loads(testbed.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"][0]
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"] == "spot-gpu-0"  # the only spot node with a GPU


def fail_inside(bed: tb.Testbed, seen: dict[str, Any]) -> None:
    """Runs the test bed and fails while it is up, the way a failing test would."""
    with bed:
        seen["pids"] = set(tb.marked_processes(bed.marker))
        seen["ports"] = tb.listening_ports(seen["pids"])
        raise RuntimeError("a failing test")


@pytest.mark.slow
def test_teardown_leaves_no_process_and_no_listening_port(tmp_path: Path) -> None:
    bed = tb.Testbed(tmp_path / "bed", nodes=[tb.spot_node("spot-0")])
    seen: dict[str, Any] = {}

    with pytest.raises(RuntimeError, match="a failing test"):
        fail_inside(bed, seen)

    assert len(seen["pids"]) >= 7  # etcd, apiserver, controller-manager, scheduler, kwok, bridge, operator
    assert seen["ports"], "the control plane should have been listening"
    assert tb.marked_processes(bed.marker) == []
    assert not [pid for pid in seen["pids"] if Path(f"/proc/{pid}").exists()]
    for address in seen["ports"]:
        host, _, port = address.rpartition(":")
        with socket.socket() as s:
            assert s.connect_ex((host.strip("[]"), int(port))) != 0, f"{address} still accepts connections"


def test_helm_installs_a_chart_into_the_test_bed(testbed: tb.Testbed, namespace: str, tmp_path: Path) -> None:
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hello\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hi\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n"
        "  greeting: {{ .Values.greeting | quote }}\n"
    )
    helm = [str(tb.binary("helm")), "--kubeconfig", str(testbed.kubeconfig), "--namespace", namespace]

    subprocess.run([*helm, "install", "hello", str(chart), "--set", "greeting=hello", "--wait"], check=True)

    configmap = json.loads(testbed.kubectl("get", "configmap", "hello", "-n", namespace, "-o", "json").stdout)
    assert configmap["data"] == {"greeting": "hello"}
    subprocess.run([*helm, "uninstall", "hello", "--wait"], check=True)
    assert testbed.kubectl("get", "configmap", "hello", "-n", namespace, check=False).returncode != 0
