"""The real nodes' configuration (hack/testbed/nodes.py): every address in 198.18.0.0/15, no NAT to
anywhere, DNS that forwards nothing, and the kubelet kept off the machine's cgroups and settings."""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "testbed"))

import nodes as real  # lives in hack/testbed

pytestmark = pytest.mark.unit

NODES = [real.RealNode("a", 1), real.RealNode("b", 2, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])]
IP_OR_CIDR = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?\b")


def every_address(text: str) -> list[str]:
    return IP_OR_CIDR.findall(text)


def rendered(tmp_path: Path) -> str:
    parts = [real.corefile(tmp_path / "kubeconfig")]
    for node in NODES:
        parts += [
            json.dumps(real.cni_config(node)),
            yaml.safe_dump(real.kubelet_config(node, tmp_path, tmp_path / "ca.crt")),
            yaml.safe_dump(real.kube_proxy_config(node, tmp_path / "kubeconfig")),
            real.containerd_config(tmp_path, tmp_path / "root", tmp_path / "cni", "localhost/pause:1", node.address),
        ]
    return "\n".join(parts)


def test_every_address_the_nodes_use_is_in_the_benchmark_range(tmp_path: Path) -> None:
    addresses = every_address(rendered(tmp_path))
    assert addresses, "the configs name no address at all?"
    for address in addresses:
        network = ipaddress.ip_network(address, strict=False)
        assert network.subnet_of(real.ALLOWED_NETWORK), f"{address} is outside 198.18.0.0/15"
    for cidr in (real.SERVICE_CIDR, real.POD_SUPERNET, *(n.pod_cidr for n in NODES)):
        assert ipaddress.ip_network(cidr).subnet_of(real.ALLOWED_NETWORK)


def test_pods_are_never_masqueraded_and_route_only_inside_the_range() -> None:
    for node in NODES:
        bridge = real.cni_config(node)["plugins"][0]
        assert bridge["ipMasq"] is False
        assert [r["dst"] for r in bridge["ipam"]["routes"]] == ["198.18.0.0/15"]  # no default route


def test_cluster_dns_answers_cluster_names_and_forwards_nothing(tmp_path: Path) -> None:
    corefile = real.corefile(tmp_path / "kubeconfig")
    assert "forward" not in corefile
    assert f"bind {real.HOST_IP}" in corefile  # never every address of the machine


def test_the_kubelet_keeps_to_its_own_cgroups_and_leaves_the_host_iptables_alone(tmp_path: Path) -> None:
    first, second = (real.kubelet_config(node, tmp_path, tmp_path / "ca.crt") for node in NODES)
    assert first["cgroupRoot"] != second["cgroupRoot"]  # two kubelets never see each other's pods
    assert first["makeIPTablesUtilChains"] is False
    assert first["authentication"]["anonymous"]["enabled"] is False
    assert first["authorization"]["mode"] == "Webhook"
    assert second["registerWithTaints"] == NODES[1].taints
    # kube-proxy must not touch the machine-wide conntrack table size.
    assert real.kube_proxy_config(NODES[0], tmp_path)["conntrack"]["maxPerCore"] == 0
