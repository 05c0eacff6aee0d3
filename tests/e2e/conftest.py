"""Session fixtures for the e2e tests: one Docker-free Kubernetes test bed with the real KubeRay
operator, and one real Ray head on loopback that the operator reaches through the Ray bridge.

    testbed      the running Testbed (testbed/cluster.py): .kubeconfig, .kubectl(...),
                 .apply(...), .preempt_node(name), .restore_node(name), .add_node(node),
                 .bridge(ns, cluster, addr), .bridge_ray_job(ns, rayjob, addr), .log_tail(name)
    kubeconfig   path of the admin kubeconfig (TLS, client certificate)
    kube_api     a kubernetes.client.ApiClient for that kubeconfig
    ray_head     a real `ray start --head` on 127.0.0.7 (or the next free address up to
                 127.0.0.16, .address); every RayCluster without its own bridge
                 entry is routed to it. .kill_job(submission_id) kills a job's processes.
                 Started again before any test if a driver drained it (SessionRayHead).
    namespace    a fresh namespace per test, deleted afterwards; with the `restricted` marker (every
                 test of spotray's own pods), Pod Security "restricted" is enforced in it

See docs/testbed.md.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

import testbed.cluster as tb

ROOT = Path(__file__).resolve().parents[2]

from spotray.train.storage.local_s3 import LocalS3Server  # noqa: E402


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    if subprocess.run([str(ROOT / "testbed" / "build.sh"), "--check"], check=False).returncode != 0:
        pytest.fail("the test bed binaries are not built: run `make testbed` (30-50 minutes cold, cached after)")
    # The work dir holds the kubeconfig, certificates, etcd data and every component's log.
    with tb.Testbed(tmp_path_factory.mktemp("testbed")) as bed:
        yield bed


@pytest.fixture(scope="session")
def kubeconfig(testbed: tb.Testbed) -> Path:
    return testbed.kubeconfig


@pytest.fixture(scope="session")
def kube_api(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(str(kubeconfig))


class SessionRayHead:
    """The session's default Ray head, which every RayCluster without a bridge entry of its own
    reaches, started again when a test drained it.

    On kwok one head stands in for every test's RayCluster. A driver SIGTERMed on a cluster it takes
    for its attempt's own (a test's namespace deleted while its job runs) drains every node of it
    for preemption (train/launch/launcher.py), and Ray never takes a drained node back: every later
    job's supervisor is then unschedulable ("NodeAffinitySchedulingStrategy ... infeasible"), in
    whichever test comes next. The GCS logs each drain, so that is what is read.
    """

    def __init__(self, testbed: tb.Testbed, workdirs: pytest.TempPathFactory, env: dict[str, str]) -> None:
        self.testbed, self.workdirs, self.env = testbed, workdirs, env
        self.head: tb.RayHead | None = None

    def drained(self) -> bool:
        if self.head is None or self.head.temp_dir is None:
            return False
        gcs_log = self.head.temp_dir / "session_latest" / "logs" / "gcs_server.out"
        return gcs_log.exists() and "Set node to be draining" in gcs_log.read_text(errors="replace")

    def current(self) -> tb.RayHead:
        if self.head is not None and self.drained():
            print(f"the Ray head on {self.head.address} was drained by a test's driver: starting another")
            self.stop()
        if self.head is None:
            self.head = tb.RayHead(self.workdirs.mktemp("ray-head"), num_cpus=3, extra_env=self.env).start()
            self.testbed.set_default_ray_head(self.head.address)
        return self.head

    def stop(self) -> None:
        if self.head is not None:
            self.testbed.set_default_ray_head(None)
            self.head.stop()
            self.head = None


_SESSION_RAY_HEADS: list[SessionRayHead] = []  # the session's, once a test has asked for it


@pytest.fixture(scope="session")
def session_ray_head(
    testbed: tb.Testbed, s3_server: LocalS3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionRayHead]:
    # Jobs on this head see what a RayJob's pods would: the S3 endpoint and keys (from the run's
    # Secret in a cluster) and the project on PYTHONPATH (the image's WORKDIR).
    heads = SessionRayHead(testbed, tmp_path_factory, {**s3_server.env(), "PYTHONPATH": str(ROOT)})
    _SESSION_RAY_HEADS.append(heads)
    try:
        yield heads
    finally:
        _SESSION_RAY_HEADS.remove(heads)
        heads.stop()


@pytest.fixture
def ray_head(session_ray_head: SessionRayHead) -> tb.RayHead:
    return session_ray_head.current()


@pytest.fixture(autouse=True)
def _no_drained_ray_head() -> None:
    """Every test starts with a usable default head, whether it asked for the head or only runs jobs on it."""
    for heads in _SESSION_RAY_HEADS:
        heads.current()


RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


def create_restricted_namespace(testbed: tb.Testbed, name: str) -> None:
    """A namespace where the API server's PodSecurity admission refuses any pod that is not "restricted"."""
    testbed.kubectl("create", "namespace", name)
    testbed.kubectl("label", "namespace", name, RESTRICTED)


@pytest.fixture
def namespace(testbed: tb.Testbed, request: pytest.FixtureRequest) -> Iterator[str]:
    # Namespace names are DNS labels: lower case, digits and '-', at most 63 characters.
    name = f"{re.sub('[^a-z0-9-]+', '-', request.node.name.lower())[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    if request.node.get_closest_marker("restricted"):
        create_restricted_namespace(testbed, name)
    else:  # the test bed's own tests make plain pods on purpose
        testbed.kubectl("create", "namespace", name)
    tb.wait_until(
        f"service account default in {name}",
        lambda: testbed.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
    )
    yield name
    # Not waiting: kwok removes the pods (deletion stage) and the namespace controller the rest.
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)
