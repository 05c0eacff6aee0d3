"""Kueue on the test bed: the real Kueue manager, built from its Go module by testbed/build.sh, run
as a host process against a Testbed's API server, like the KubeRay operator (docs/testbed.md, "Kueue").

A real install runs it as a Deployment behind a Service, with webhooks the API server calls. Here
the API server cannot dial a Service by name, so three things differ, all on purpose:

- Kueue's own admission webhooks are not registered. They would make a RayJob that carries
  kueue.x-k8s.io/queue-name suspended on creation; spotray's controller already creates such a
  RayJob suspended (controller/rayjob.py), so admission, quota, priorities and eviction are
  Kueue's own code either way.
- Its CRDs get the conversion stanza a real install's kustomize patches add (Kueue's cert
  rotator waits for it), but every object here is written at the storage version, v1beta2, so
  the API server never has to call the conversion webhook.
- The webhook certificate the rotator writes into its Secret is copied into the cert dir here,
  as a kubelet does for the Secret volume of a real install's pod.

Started on demand (``Kueue(testbed).start()``), by tests that queue runs: a Testbed without it is as
before. It manages only jobs that name a queue (``manageJobsWithoutQueueName`` is off), so the other
tests' RayJobs on the same test bed are untouched.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from spotray.train.storage.local_s3 import free_ports
from testbed.cluster import Testbed, answers_ok, wait_until
from testbed.nodes import CACHE, versions

NAMESPACE = "kueue-system"
API_VERSION = "kueue.x-k8s.io/v1beta2"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"  # noqa: S105 - a Secret's name, no password
# The CRDs Kueue's config/components/crd/kustomization.yaml patches with a conversion webhook
# (patches/webhook_in_*.yaml): its cert rotator injects its CA into these and is not ready until it has.
CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# The integrations a TrainingRun needs (its RayJobs), and batch/job for a competing workload in tests.
FRAMEWORKS = ["ray.io/rayjob", "batch/job"]


def kueue_dir() -> Path:
    path = CACHE / f"kueue-{versions()['KUEUE_VERSION']}"
    if not (path / "bin" / "kueue").exists():
        raise FileNotFoundError(f"{path}/bin/kueue is missing: run testbed/build.sh (or make testbed)")
    return path


def crds() -> list[dict[str, Any]]:
    """Kueue's CRDs as a real install applies them: with the conversion webhook its patches add."""
    documents = []
    for path in sorted((kueue_dir() / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
            service = {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "path": "/convert"}
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {"clientConfig": {"service": service}, "conversionReviewVersions": ["v1"]},
            }
        documents.append(crd)
    return documents


def configuration(workdir: Path, webhook_port: int, health_port: int) -> dict[str, Any]:
    """The manager's config file: one replica, no leader election, every port on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(workdir / "certs")},
        # The rotator writes the webhook's certificate into this Secret (made empty below) and its
        # CA into the CRDs above; with it off, the manager wants certificates under /etc/kueue.
        "internalCertManagement": {"enable": True},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": FRAMEWORKS},
    }


class Kueue:
    """The Kueue manager on ``testbed``; stopped with the test bed (it is one of its processes)."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self.workdir = testbed.workdir / "kueue"

    def start(self, timeout: float = 120) -> Kueue:
        bed = self.testbed
        bed.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(crds()))
        bed.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        bed.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}},
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        webhook_port, self.health_port = free_ports(2)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(configuration(self.workdir, webhook_port, self.health_port)))
        bed._spawn(  # one of the test bed's processes: killed with it
            "kueue",
            [
                str(kueue_dir() / "bin" / "kueue"),
                f"--config={config}",
                # On-demand visibility is an aggregated API server of its own, with a port and an
                # APIService; nothing here reads it.
                "--feature-gates=VisibilityOnDemand=false",
                "--zap-log-level=info",
            ],
            env={"KUBECONFIG": str(bed.kubeconfig)},
        )
        # What the kubelet does for the Secret volume a real install mounts at the cert dir: the rotator
        # waits for the certificate it wrote into the Secret to appear there as files.
        certs = wait_until("Kueue's webhook certificate in its Secret", self.certificate, timeout=timeout)
        cert_dir = self.workdir / "certs"
        cert_dir.mkdir(mode=0o700, exist_ok=True)
        for name, value in certs.items():
            path = cert_dir / name
            path.touch(mode=0o600)
            path.write_bytes(base64.b64decode(value))
        wait_until("Kueue's manager ready (certificates made, controllers started)", self.ready, timeout=timeout)
        return self

    def certificate(self) -> dict[str, str] | None:
        """The webhook Secret's data (base64) once the rotator has written the server certificate."""
        self.testbed._check_alive()
        found = self.testbed.kubectl("get", "secret", WEBHOOK_SECRET, "-n", NAMESPACE, "-o", "json", check=False)
        data: dict[str, str] = json.loads(found.stdout).get("data") or {} if found.returncode == 0 else {}
        return data if "tls.crt" in data and "tls.key" in data else None

    def ready(self) -> bool:
        self.testbed._check_alive()  # says why, with the log's tail, if it exited
        return answers_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    # -- the objects a test queues runs with ----------------------------------------------------

    def cluster_queue(self, name: str, cpu: str, memory: str) -> None:
        """A ClusterQueue with one default ResourceFlavor and this much quota, for every namespace; a
        higher-priority workload may preempt a lower one in it."""
        preemption = {"withinClusterQueue": "LowerPriority"}
        self.testbed.apply(
            {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": f"{name}-flavor"}},
            {
                "apiVersion": API_VERSION,
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {},
                    "preemption": preemption,
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [
                                {
                                    "name": f"{name}-flavor",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": cpu},
                                        {"name": "memory", "nominalQuota": memory},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )

    def local_queue(self, namespace: str, name: str, cluster_queue: str) -> None:
        self.testbed.apply(
            {
                "apiVersion": API_VERSION,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            }
        )

    def priority_class(self, name: str, value: int) -> None:
        self.testbed.apply(
            {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        )

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        found = self.testbed.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
        items: list[dict[str, Any]] = json.loads(found.stdout)["items"]
        return items
