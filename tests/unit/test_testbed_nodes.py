"""The real nodes' configuration (testbed/nodes.py): every address in 198.18.0.0/15, no NAT to
anywhere, DNS that forwards nothing, and the kubelet kept off the machine's cgroups and settings."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
import yaml

from testbed import nodes as real

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
    parts += [" ".join(rule) for rule in real.network_policy_rules(real.POD_SUPERNET)]
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


def test_every_new_connection_to_or_from_a_pod_goes_to_the_policy_agent_and_nothing_passes_unjudged() -> None:
    """The shim that stands in for kube-network-policies' own nft rules (this kernel has no nft queue)."""
    rules = real.network_policy_rules(real.POD_SUPERNET)
    assert all(rule[:3] == ["-w", "-t", "mangle"] for rule in rules)
    chain = real.NETWORK_POLICY_CHAIN
    body = [rule[3:] for rule in rules if rule[3:5] == ["-A", chain]]
    queue = ["-j", "NFQUEUE", "--queue-num", str(real.NETWORK_POLICY_QUEUE)]
    # Replies ride on their connection, and the node's own traffic (the kubelet's probes) is not judged...
    assert body[0][2:] == ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"]
    assert body[1][2:] == ["-m", "addrtype", "--src-type", "LOCAL", "-j", "RETURN"]
    # ... every other packet to or from a pod is, with no bypass when the agent is gone.
    assert body[2:] == [["-A", chain, "-d", real.POD_SUPERNET, *queue], ["-A", chain, "-s", real.POD_SUPERNET, *queue]]
    assert not any("--queue-bypass" in rule for rule in rules)
    # The chain is filled before POSTROUTING jumps to it.
    assert rules[0][3:] == ["-N", chain]
    assert rules[-1][3:] == ["-A", "POSTROUTING", "-j", chain]


def test_the_node_waits_for_the_agent_to_listen_on_its_queue(tmp_path: Path) -> None:
    table = tmp_path / "nfnetlink_queue"
    assert not real.queue_bound(100, tmp_path / "absent")
    table.write_text("")
    assert not real.queue_bound(100, table)
    other = "    1  12345     0 2  128     0     0        0  1\n"
    table.write_text(other)
    assert not real.queue_bound(100, table)
    table.write_text(other + "  100  23415     0 2  128     0     0        7  1\n")
    assert real.queue_bound(100, table)
