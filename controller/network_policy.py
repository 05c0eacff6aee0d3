"""A run's NetworkPolicy (pure): only the run's own pods and the KubeRay operator reach its Ray ports.

A Ray head's dashboard (8265) accepts job submissions, and a job runs with the pods' S3
credentials; GCS (6379), the client port (10001) and the workers' ports are no safer. So each run
gets one policy, made by the controller before the run's first RayJob, in the run's namespace, in
every install mode: it selects the pods of the run (head, workers and submitter of every attempt,
by the run label the controller puts on them) and admits traffic only from those same pods and
from the KubeRay operator's (``ControllerConfig.kuberay_peer``, and ``kuberay_ip_blocks`` for an
operator outside the pod network), which polls each head's dashboard.
A pod of another run, of the same namespace or another, gets nothing. ``kubectl port-forward`` goes
through the kubelet, which NetworkPolicies do not filter.

With ``ControllerConfig.run_egress`` set (the chart's default), it also limits where the run's pods
connect: their own run's pods, DNS (port 53, wherever the cluster's resolver is), and the rules
given (the chart's: HTTPS anywhere, for S3, and its MinIO's S3 port), so a job's code cannot reach
another run's pods, the cloud's metadata server or the cluster's other services.

Owned by the TrainingRun, so it goes with the run. NetworkPolicies add up: a pod selected by a
broader policy too would be reachable by what that one admits, so the chart renders no
namespace-wide policy for run pods when these are on (charts/spotray/templates/networkpolicy.yaml).
Enforced by the cluster's CNI; where none enforces policies the API server still accepts it.
"""

from __future__ import annotations

import copy
from typing import Any

from spotray.contract.names import RUN_LABEL
from spotray.contract.spec import TrainingRun
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import MANAGED_BY, owner_reference

NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
# The policy's name: the run's name and this (a run name is at most 63 characters).
NETWORK_POLICY_SUFFIX = "-ray"
# Names, from whichever resolver the cluster runs (CoreDNS in kube-system, node-local DNS, ...).
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def network_policy_name(run_name: str) -> str:
    return f"{run_name}{NETWORK_POLICY_SUFFIX}"


def build_run_network_policy(run: TrainingRun, run_uid: str, config: ControllerConfig) -> dict[str, Any]:
    """The NetworkPolicy of ``run``: its pods admit only its own pods and the KubeRay operator, and
    (``run_egress`` set) connect only to their own pods, DNS and what ``run_egress`` allows."""
    run_pods = {RUN_LABEL: run.name, **MANAGED_BY}
    operator = [copy.deepcopy(config.kuberay_peer)] + [{"ipBlock": {"cidr": c}} for c in config.kuberay_ip_blocks]
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": dict(run_pods)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": dict(run_pods)}}, *operator]}],
    }
    if config.run_egress is not None:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = [
            {"to": [{"podSelector": {"matchLabels": dict(run_pods)}}]},
            {"ports": copy.deepcopy(DNS_PORTS)},
            *copy.deepcopy(config.run_egress),
        ]
    return {
        "apiVersion": NETWORK_POLICY_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(run.name),
            "namespace": run.namespace,
            "labels": dict(run_pods),
            "ownerReferences": [owner_reference(run.name, run_uid)],
        },
        "spec": spec,
    }
