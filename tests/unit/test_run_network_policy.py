"""controller/network_policy.py: each run's NetworkPolicy admits only the run's own pods and KubeRay.

Before, the only policy for run pods was the chart's, one per namespace admitting every spotray pod
of the namespace, and none at all for a cluster-wide install (issue 38): any pod could POST a job to
``<run>-head-svc:8265``. The rule is checked here by evaluating the policy against pods' labels, as a
CNI would; the API server's acceptance of it is in tests/e2e (no CNI here enforces it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException, V1NetworkPolicy, V1ObjectMeta, V1OwnerReference

from spotray.contract.errors import SpotrayError
from spotray.contract.names import ATTEMPT_LABEL, RUN_LABEL
from spotray.contract.spec import parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.network_policy import build_run_network_policy, network_policy_name
from tests.unit.test_status_unreadable import FakeCluster, body

pytestmark = pytest.mark.unit

MANAGED = {"app.kubernetes.io/managed-by": "spotray"}
KUBERAY = {"app.kubernetes.io/name": "kuberay-operator"}


def run(name: str, namespace: str = "ml") -> Any:
    return parse_training_run(
        {
            "apiVersion": "spotray.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bucket/runs/x"}},
        }
    )


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def admits(policy: dict[str, Any], pod: dict[str, str], namespace: str, namespace_labels: dict[str, str]) -> bool:
    """Whether ``policy`` lets a pod with labels ``pod`` in ``namespace`` reach the pods it selects."""
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "ipBlock" in peer:  # admits addresses outside the pod network, never a pod by its labels
                continue
            in_namespace = (
                selects(peer["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in peer
                else namespace == policy["metadata"]["namespace"]
            )
            if in_namespace and selects(peer.get("podSelector", {}), pod):
                return True
    return False


def test_a_runs_pods_admit_only_their_own_run_and_the_kuberay_operator() -> None:
    policy = build_run_network_policy(run("alpha"), "uid-alpha", ControllerConfig())
    assert policy["metadata"]["name"] == network_policy_name("alpha") == "alpha-ray"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-alpha"  # goes with the run
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    head = {RUN_LABEL: "alpha", ATTEMPT_LABEL: "3", **MANAGED, "ray.io/node-type": "head"}
    assert selects(policy["spec"]["podSelector"], head)
    assert not selects(policy["spec"]["podSelector"], {RUN_LABEL: "beta", **MANAGED})
    ml = {"kubernetes.io/metadata.name": "ml"}
    # its own pods, of any attempt; and the KubeRay operator, wherever it runs
    assert admits(policy, {RUN_LABEL: "alpha", ATTEMPT_LABEL: "1", **MANAGED}, "ml", ml)
    assert admits(policy, KUBERAY, "ray-system", {"kubernetes.io/metadata.name": "ray-system"})
    # nobody else: another run of the namespace, a pod with the run's label elsewhere, any pod
    assert not admits(policy, {RUN_LABEL: "beta", ATTEMPT_LABEL: "1", **MANAGED}, "ml", ml)
    assert not admits(policy, {RUN_LABEL: "alpha", **MANAGED}, "other", {"kubernetes.io/metadata.name": "other"})
    assert not admits(policy, {"app": "curl"}, "ml", ml)


def test_the_kuberay_peer_comes_from_the_chart() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"team": "ray"}}, "podSelector": {"matchLabels": {"app": "op"}}}
    config = ControllerConfig.from_env(
        {
            "SPOTRAY_RUN_NETWORK_POLICY": "true",
            "SPOTRAY_KUBERAY_PEER": '{"namespaceSelector": {"matchLabels": '
            '{"team": "ray"}}, "podSelector": {"matchLabels": {"app": "op"}}}',
        }
    )
    assert config.run_network_policy
    assert build_run_network_policy(run("a"), "u", config)["spec"]["ingress"][0]["from"][1] == peer
    assert not ControllerConfig.from_env({}).run_network_policy


def test_an_operator_outside_the_pod_network_is_admitted_by_its_addresses_alone() -> None:
    """A KubeRay operator on the host network (or the test bed's, on the host) matches no pod selector."""
    config = ControllerConfig.from_env({"SPOTRAY_KUBERAY_IP_BLOCKS": "198.18.254.254, 192.0.2.0/28"})
    assert config.kuberay_ip_blocks == ("198.18.254.254/32", "192.0.2.0/28")
    policy = build_run_network_policy(run("alpha"), "uid-alpha", config)
    peers = policy["spec"]["ingress"][0]["from"]
    assert peers[2:] == [{"ipBlock": {"cidr": "198.18.254.254/32"}}, {"ipBlock": {"cidr": "192.0.2.0/28"}}]
    ml = {"kubernetes.io/metadata.name": "ml"}
    assert not admits(policy, {"app": "curl"}, "ml", ml), "an address block admits no pod of the namespace"
    assert len(build_run_network_policy(run("a"), "u", ControllerConfig())["spec"]["ingress"][0]["from"]) == 2


def test_a_kuberay_ip_block_that_is_not_an_address_stops_the_controller_with_the_fix() -> None:
    with pytest.raises(SpotrayError, match=r"SPOTRAY_KUBERAY_IP_BLOCKS must list CIDRs, got 'kuberay\.ray-system'"):
        ControllerConfig.from_env({"SPOTRAY_KUBERAY_IP_BLOCKS": "kuberay.ray-system"})


def test_with_egress_limited_a_runs_pods_reach_only_their_run_dns_and_the_rules_given() -> None:
    https = {"ports": [{"port": 443, "protocol": "TCP"}]}
    config = ControllerConfig.from_env({"SPOTRAY_RUN_EGRESS": '[{"ports": [{"port": 443, "protocol": "TCP"}]}]'})
    assert config.run_egress == [https]
    spec = build_run_network_policy(run("alpha"), "uid-alpha", config)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    own, dns, *given = spec["egress"]
    assert own == {"to": [{"podSelector": {"matchLabels": {RUN_LABEL: "alpha", **MANAGED}}}]}  # every port
    assert dns == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}  # to any resolver
    assert given == [https]
    # No rule opens another run's Ray ports (its ingress would refuse anyway) or the metadata server's port 80.
    ports = {port["port"] for rule in spec["egress"] if "to" not in rule for port in rule["ports"]}
    assert ports == {53, 443}
    unlimited = build_run_network_policy(run("alpha"), "uid-alpha", ControllerConfig())["spec"]
    assert unlimited["policyTypes"] == ["Ingress"]
    assert "egress" not in unlimited


class PolicyCluster(FakeCluster):
    """The fake API server, plus NetworkPolicies: ``existing`` is one already there with those owner UIDs."""

    def __init__(
        self, run_body: dict[str, Any], refuse: ApiException | None = None, existing: list[str] | None = None
    ) -> None:
        super().__init__(run_body)
        self.policies: list[dict[str, Any]] = []
        self.refuse = refuse
        self.existing = existing
        self.calls: list[str] = []

    def create_network_policy(self, policy: dict[str, Any]) -> list[str] | None:
        self.calls.append("policy")
        # The real Cluster's handling of the API server's answers, over this fake's "server".
        real = Cluster.__new__(Cluster)
        real.networking = self  # type: ignore[assignment]
        return Cluster.create_network_policy(real, policy)

    def create_namespaced_network_policy(self, namespace: str, policy: dict[str, Any], **_: Any) -> None:
        if self.refuse is not None:
            raise self.refuse
        if self.existing is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.policies.append(policy)

    def read_namespaced_network_policy(self, name: str, namespace: str, **_: Any) -> V1NetworkPolicy:
        assert (namespace, name) == ("ns", "r-ray")
        owners = [V1OwnerReference(api_version="v1", kind="Thing", name="t", uid=uid) for uid in self.existing or []]
        return V1NetworkPolicy(metadata=V1ObjectMeta(name=name, owner_references=owners or None))

    def create_rayjob(self, rayjob: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("rayjob")
        return super().create_rayjob(rayjob)


def test_the_policy_is_made_before_the_runs_first_rayjob(tmp_path: Path) -> None:
    fake = PolicyCluster(body(tmp_path, None))
    fake.reconcile(fake.config(run_network_policy=True))
    assert fake.calls == ["policy", "rayjob"]
    assert fake.policies[0]["metadata"]["ownerReferences"][0]["uid"] == fake.run["metadata"]["uid"]


def test_a_policy_the_api_server_refuses_holds_the_rayjob_back(tmp_path: Path) -> None:
    """No pod of the run starts unprotected: a 403 (the controller's role lacks the right) leaves the
    attempt waiting, as a refused RayJob does, saying why."""
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = '{"reason": "Forbidden", "message": "networkpolicies.networking.k8s.io is forbidden"}'
    fake = PolicyCluster(body(tmp_path, None), refuse=forbidden)
    fake.reconcile(fake.config(run_network_policy=True))
    assert fake.calls == ["policy"]
    assert fake.rayjobs == {}
    status = fake.run["status"]
    assert status["phase"] == "Pending"
    assert "NetworkPolicy r-ray" in status["message"]
    assert "forbidden" in status["message"]


def test_without_the_setting_no_policy_is_made(tmp_path: Path) -> None:
    fake = PolicyCluster(body(tmp_path, None))
    fake.reconcile()
    assert fake.calls == ["rayjob"]


def test_a_policy_left_by_an_earlier_attempt_of_the_run_is_kept(tmp_path: Path) -> None:
    run_body = body(tmp_path, None)
    fake = PolicyCluster(run_body, existing=[run_body["metadata"]["uid"]])
    fake.reconcile(fake.config(run_network_policy=True))
    assert fake.calls == ["policy", "rayjob"]


def test_a_deleted_namesakes_policy_holds_the_new_runs_rayjob_back_until_it_is_gone(tmp_path: Path) -> None:
    """Before, a 409 was taken as made: the garbage collector then removed the deleted run's policy
    and the new run's pods ran without one until its next attempt (docs/security.md named the gap)."""
    fake = PolicyCluster(body(tmp_path, None), existing=["uid-of-the-deleted-run"])
    fake.reconcile(fake.config(run_network_policy=True))
    assert fake.calls == ["policy"]
    assert fake.rayjobs == {}
    message = fake.run["status"]["message"]
    assert "NetworkPolicy ns/r-ray exists and is not this run's (owned by another object)" in message
    fake.existing = None  # collected: the next reconcile makes the run's own, then the RayJob
    fake.reconcile(fake.config(run_network_policy=True))
    assert fake.calls == ["policy", "policy", "rayjob"]
