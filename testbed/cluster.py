"""A Docker-free Kubernetes test bed: real etcd, kube-apiserver, controller-manager, scheduler,
kwok nodes and the real KubeRay operator, all on loopback, plus a bridge that lets the operator
reach real Ray heads running on this machine.

Used by tests/e2e/conftest.py (as a library) and by `make cluster-up` / `make cluster-down`
(as a script: `python -m testbed.cluster up|down|status`). The binaries come from
testbed/build.sh.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from spotray.contract.names import SPOT_LABEL, SPOT_LABEL_ON_DEMAND, SPOT_LABEL_SPOT, SPOT_TAINT_KEY
from spotray.local.local_ray import LocalRayWorkerNode
from spotray.train.processes.subprocesses import is_running, session_members, start_time
from spotray.train.storage.local_s3 import free_port, free_ports
from testbed import nodes as real
from testbed.nodes import CACHE, versions

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Every process the test bed starts carries this variable (children and grandchildren inherit
# it), so teardown can find and kill anything that escaped its process group.
MARKER = "SPOTRAY_TESTBED"
# containerd refuses a socket path longer than this ("unix socket path too long (> 104)").
MAX_SOCKET_PATH = 104
CLUSTER_DOMAIN = "cluster.local"
# Nothing may send traffic to private ranges here, so cluster IPs and pod IPs are loopback
# addresses nobody listens on: a stray connection fails locally instead of leaving the machine.
SERVICE_CIDR = "127.96.0.0/16"
POD_CIDR = "127.100.0.0/16"
NODE_IP = "127.0.0.1"
# The taint on the test bed's spot nodes (and kind-config.yaml's), which only spot workers tolerate.
SPOT_TAINT = {"key": SPOT_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
# Ray heads for the bridge live on 127.0.0.<N>, away from 127.0.0.1 where other tests listen:
# from .7 up for tests (the first whose port 8265 is free), .17 for `make cluster-up`.
RAY_HEAD_IPS = [f"127.0.0.{n}" for n in range(7, 17)]
CLUSTER_UP_RAY_HEAD_IP = "127.0.0.17"
# A Ray worker node that a test joins to a head (RayHead.add_worker_node): outside the heads' addresses.
RAY_WORKER_NODE_IP = "127.0.0.17"
RAY_DASHBOARD_PORT = 8265  # the port KubeRay's head Service names `dashboard`
# Ray's socket paths must stay under 107 bytes, so its temp dirs are short and in /tmp.
RAY_TEMP_ROOT = "/tmp"  # noqa: S108 - only a parent for mkdtemp, which is safe
RAY_TEMP_PREFIX = "spotray-testbed-ray-"


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [system:serviceaccounts]
  - level: None
"""


def binary(name: str) -> Path:
    v = versions()
    component = {
        "etcd": f"etcd-{v['ETCD_VERSION']}",
        "kube-apiserver": f"kubernetes-{v['KUBERNETES_VERSION']}",
        "kube-controller-manager": f"kubernetes-{v['KUBERNETES_VERSION']}",
        "kube-scheduler": f"kubernetes-{v['KUBERNETES_VERSION']}",
        "kubectl": f"kubernetes-{v['KUBERNETES_VERSION']}",
        "kwok": f"kwok-{v['KWOK_VERSION']}",
        "ray-operator": f"kuberay-{v['KUBERAY_VERSION']}",
        "helm": f"helm-{v['HELM_VERSION']}",
        "minio": f"minio-{v['MINIO_VERSION']}",
        "mc": f"mc-{v['MC_VERSION']}",
    }[name]
    path = CACHE / component / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run testbed/build.sh (or make testbed)")
    return path


def kuberay_crds() -> list[Path]:
    return sorted((CACHE / f"kuberay-{versions()['KUBERAY_VERSION']}" / "crds").glob("*.yaml"))


def ray_head_address_free(address: str) -> bool:
    """Nobody listens on ``address``'s dashboard port."""
    with socket.socket() as s:
        return s.connect_ex((address, RAY_DASHBOARD_PORT)) != 0


def free_ray_head_address() -> str:
    """The first of RAY_HEAD_IPS whose dashboard port nobody holds."""
    for address in RAY_HEAD_IPS:
        if ray_head_address_free(address):
            return address
    raise RuntimeError(f"port {RAY_DASHBOARD_PORT} is taken on every one of {RAY_HEAD_IPS}")


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test process dies, even by SIGKILL."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process: a process
# started from a short-lived thread (a fault's, a benchmark's reclaimer) was SIGKILLed as that thread
# ended (the nemesis campaign lost a restarted API server so). So every process the test bed starts
# is forked from this one thread, which lives as long as the process.
_FORKER = ThreadPoolExecutor(1, thread_name_prefix="testbed-forker")


def popen_dying_with_us(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **options)``, the child SIGKILLed when this process dies (even by
    SIGKILL), whichever thread asks."""
    started: subprocess.Popen[bytes] = _FORKER.submit(
        subprocess.Popen, argv, preexec_fn=_die_with_parent, **options
    ).result()
    return started


def marked_processes(marker_value: str | None = None) -> list[int]:
    """Pids whose environment carries MARKER (with this value, if given)."""
    found = []
    prefix = f"{MARKER}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or a kernel thread
        for item in environ:
            if item.startswith(prefix):
                value = item[len(prefix) :].decode(errors="replace")
                if marker_value is None or value == marker_value:
                    found.append(int(entry.name))
                break
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def processes_using(path: Path) -> list[int]:
    """Pids with path, or a file under it, open (or as their working directory).

    Ray's agents rewrite their environment with setproctitle, hiding MARKER, but they always
    keep their log files open in the Ray temp dir, which is ours alone.
    """
    found = []
    prefix = str(path) + "/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [str(fd.readlink()) for fd in (entry / "fd").iterdir()] + [str((entry / "cwd").readlink())]
        except OSError:
            continue  # gone, or not ours to read
        if any(link == str(path) or link.startswith(prefix) for link in links):
            found.append(int(entry.name))
    return found


def reap_orphans() -> list[int]:
    """Kills test bed processes whose owner is gone (a test run killed with SIGKILL earlier).

    The marker value starts with the owner's pid; processes of a live owner are left alone, so
    a developer's `make cluster-up` cluster survives a test run and vice versa. Ray temp dirs
    record their owner in a file `owner`.
    """
    victims = []
    for temp_dir in Path(RAY_TEMP_ROOT).glob(f"{RAY_TEMP_PREFIX}*"):
        owner_file = temp_dir / "owner"
        owner = owner_file.read_text().strip() if owner_file.exists() else ""
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            victims += processes_using(temp_dir)
            kill_pids(victims)
            shutil.rmtree(temp_dir, ignore_errors=True)
    for pid in marked_processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        value = next((e for e in environ if e.startswith(f"{MARKER}=".encode())), b"").decode()
        owner = value.partition("=")[2].partition(":")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            victims.append(pid)
    kill_pids(victims)
    real.reap_orphans()
    return victims


def listening_ports(pids: set[int]) -> list[str]:
    """Listening TCP sockets (as 'addr:port') owned by any of pids, from `ss`."""
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    ports = []
    for line in out.splitlines():
        if any(f"pid={pid}," in line for pid in pids):
            ports.append(line.split()[3])
    return ports


class ProcessDiedError(RuntimeError):
    """A test bed process exited while we waited on it: fail now, not at the timeout."""


def answers_ok(url: str) -> bool:
    """Whether a health endpoint on loopback answers 200 now (a process's readiness)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - http on loopback, built by callers
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_until(what: str, check: Any, timeout: float = 60, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except ProcessDiedError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"; the last one is reported
            last_error = e
        else:
            if result:
                return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(pki: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """A CA, the apiserver's serving cert, an admin client cert and the service account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=spotray-testbed-ca",
             "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))  # fmt: skip
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
    san += "".join(f",IP:{ip}" for ip in extra_ips)
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", san),
        # O=system:masters: the admin user; every component uses it (see docs/testbed.md).
        ("admin", "/O=system:masters/CN=spotray-admin", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                 "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr"))  # fmt: skip
        extfile = pki / f"{name}.ext"
        extfile.write_text(ext + "\n")
        _openssl("x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "30",
                 "-extfile", str(extfile), "-out", str(pki / f"{name}.crt"))  # fmt: skip
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


@dataclass
class Node:
    """A kwok node: name, labels, taints and capacity."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    cpu: str = "32"
    memory: str = "128Gi"
    gpus: int = 0

    def manifest(self) -> dict[str, Any]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        if self.gpus:
            capacity["nvidia.com/gpu"] = str(self.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                # kwok manages only nodes carrying this annotation.
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **self.labels,
                },
            },
            "spec": {"taints": self.taints},
            "status": {"capacity": capacity, "allocatable": capacity},
        }


def spot_node(name: str, gpus: int = 0) -> Node:
    labels = {SPOT_LABEL: SPOT_LABEL_SPOT}
    if gpus:
        labels["nvidia.com/gpu.present"] = "true"
    return Node(name, labels=labels, taints=[dict(SPOT_TAINT)], gpus=gpus)


def on_demand_node(name: str, gpus: int = 0) -> Node:
    labels = {SPOT_LABEL: SPOT_LABEL_ON_DEMAND}
    if gpus:
        labels["nvidia.com/gpu.present"] = "true"
    return Node(name, labels=labels, gpus=gpus)


DEFAULT_NODES = [
    on_demand_node("ondemand-0"),
    on_demand_node("ondemand-gpu-0", gpus=4),
    spot_node("spot-0"),
    spot_node("spot-1"),
    spot_node("spot-2"),
    spot_node("spot-gpu-0", gpus=8),
]


class Testbed:
    """One control plane in a work directory. start() brings it up; stop() leaves nothing behind.

    The process that creates it owns it: the pytest process for tests, the detached supervisor
    for `make cluster-up`. Every component dies with its owner (PR_SET_PDEATHSIG).
    """

    def __init__(
        self, workdir: Path, nodes: list[Node] | None = None, real_nodes: list[real.RealNode] | None = None
    ) -> None:
        self.workdir = workdir
        self.nodes = DEFAULT_NODES if nodes is None else nodes
        # Real kubelets running real containers (testbed/nodes.py); none by default.
        self.real_nodes = real_nodes or []
        self.fabric = real.Fabric(os.getpid()) if self.real_nodes else None
        self.api_address = real.HOST_IP if self.real_nodes else "127.0.0.1"
        self.marker = f"{os.getpid()}:{workdir}"
        self.kubeconfig = workdir / "kubeconfig"
        self.hosts_file = workdir / "hosts"
        self.ray_heads_file = workdir / "ray-heads.json"
        self.logs = workdir / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}  # to start one again

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = popen_dying_with_us(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {}), MARKER: self.marker},
                # Its own process group, so teardown can kill it with all its children.
                start_new_session=True,
                cwd=REPO,  # where `python -m testbed.cluster` finds its package
            )
        self.procs[name] = proc
        self.commands[name] = (argv, env)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ProcessDiedError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    # -- start --------------------------------------------------------------------------------

    def start(self) -> Testbed:
        started = time.monotonic()
        reap_orphans()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.fabric:
                self.fabric.up()
            for phase in (self._start_control_plane, self._start_kwok, self._start_real_nodes, self._start_kuberay):
                phase()
                print(f"[testbed] {phase.__name__[7:]} ready at {time.monotonic() - started:.1f}s", flush=True)
        except BaseException:
            self.stop()
            raise
        print(f"[testbed] up in {time.monotonic() - started:.1f}s; KUBECONFIG={self.kubeconfig}", flush=True)
        return self

    def _start_control_plane(self) -> None:
        pki = self.workdir / "pki"
        self.pki = pki
        # With real nodes the API server listens on the fabric address, where kubelets and pods
        # reach it, and pods reach it through the `kubernetes` Service's first address too.
        service_cidr = real.SERVICE_CIDR if self.real_nodes else SERVICE_CIDR
        first_service_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
        make_pki(pki, (real.HOST_IP, first_service_ip) if self.real_nodes else ())
        etcd_port, etcd_peer, api_port = free_ports(3)
        self.api_port = api_port
        self._spawn("etcd", [
            str(binary("etcd")), "--data-dir", str(self.workdir / "etcd"), "--name", "testbed",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"testbed=http://127.0.0.1:{etcd_peer}",
            # A throwaway store: no fsync per write keeps it fast on a loaded machine.
            "--unsafe-no-fsync", "--log-level", "warn",
        ])  # fmt: skip
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self._spawn("kube-apiserver", [
            str(binary("kube-apiserver")),
            "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", self.api_address, "--advertise-address", self.api_address,
            "--secure-port", str(api_port),
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--service-account-issuer", f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", service_cidr,
            "--authorization-mode", "Node,RBAC",
            *self._endpoint_flags(pki),
            "--allow-privileged=true",
            "--profiling=false",
            # Every request a ServiceAccount makes, in metadata (verb, resource, user, code): the
            # controller's rights are compared with what it really called (tests/e2e/test_chart_install.py).
            "--audit-policy-file", str(self.workdir / "audit-policy.yaml"),
            "--audit-log-path", str(self.audit_log),
        ])  # fmt: skip
        self._write_kubeconfig(pki, api_port)
        wait_until("kube-apiserver /readyz", lambda: self._check_alive() or self._readyz(), timeout=120)
        common = ["--kubeconfig", str(self.kubeconfig), "--leader-elect=false", "--profiling=false"]
        self._spawn("kube-controller-manager", [
            str(binary("kube-controller-manager")), *common,
            "--secure-port", "0",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--service-cluster-ip-range", service_cidr,
            "--use-service-account-credentials=false",
            # Nodes come and go in tests (preemption): act on them without the usual minutes of grace.
            "--node-monitor-grace-period", "20s",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [str(binary("kube-scheduler")), *common, "--secure-port", "0"])
        # Pods need their namespace's `default` service account, which the controller-manager makes.
        wait_until("the default service account", lambda: self._check_alive() or self._has_default_sa(), timeout=90)

    def _endpoint_flags(self, pki: Path) -> list[str]:
        if not self.real_nodes:
            # The apiserver's own endpoint would be 127.0.0.1, which Endpoints validation rejects;
            # nothing in the kwok test bed reaches the apiserver through the `kubernetes` Service.
            return ["--endpoint-reconciler-type", "none"]
        crt, key = real.client_cert(pki, "apiserver-kubelet-client", "/CN=kube-apiserver-kubelet-client")
        return [
            "--kubelet-client-certificate", str(crt), "--kubelet-client-key", str(key),
            # The kubelets also publish a Hostname address the machine's resolver cannot answer.
            "--kubelet-preferred-address-types", "InternalIP",
        ]  # fmt: skip

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit" / "audit.log"

    def requests_by(self, username: str) -> list[dict[str, Any]]:
        """The audit log's record of every request ``username`` made (ServiceAccounts only are logged)."""
        found = []
        with self.audit_log.open() as log:
            for line in log:
                event = json.loads(line)
                if event.get("user", {}).get("username") == username:
                    found.append(event)
        return found

    def request_counts(self, username: str, since: float, until: float) -> collections.Counter[str]:
        """How many requests of each kind ("get trainingruns", "patch trainingruns/status") ``username``
        made from ``since`` to ``until`` (Unix times, by when the API server received them)."""
        counts: collections.Counter[str] = collections.Counter()
        for event in self.requests_by(username):
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if event.get("stage") == "ResponseComplete" and since <= at < until:
                ref = event.get("objectRef") or {}
                subresource = f"/{ref['subresource']}" if ref.get("subresource") else ""
                counts[f"{event['verb']} {ref.get('resource', '?')}{subresource}"] += 1
        return counts

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path, duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (a token from the TokenRequest API)."""
        token = self.kubectl("create", "token", account, "-n", namespace, f"--duration={duration}").stdout.strip()
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cluster = admin["clusters"][0]
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [cluster],
                    "users": [{"name": account, "user": {"token": token}}],
                    "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
                    "current-context": account,
                }
            )
        )
        return path

    def namespace_admin_kubeconfig(self, namespace: str, account: str, path: Path) -> tuple[Path, str]:
        """A kubeconfig for a new ServiceAccount with every right in ``namespace`` and none outside it.

        Returns it and the account's user name: its requests are in the audit log (``requests_by``),
        which is how a test or benchmark counts what an operator asked of the API server.
        """
        self.kubectl("create", "serviceaccount", account, "-n", namespace)
        self.kubectl(
            "create", "rolebinding", account, "-n", namespace,
            "--clusterrole=cluster-admin", f"--serviceaccount={namespace}:{account}",
        )  # fmt: skip
        return self.service_account_kubeconfig(namespace, account, path), f"system:serviceaccount:{namespace}:{account}"

    def _has_default_sa(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0

    def _readyz(self) -> bool:
        return self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0

    def _write_kubeconfig(self, pki: Path, port: int) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {
                "server": f"https://{self.api_address}:{port}", "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "admin"}}],
            "current-context": "testbed",
        }  # fmt: skip
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def _start_kwok(self) -> None:
        if not self.nodes:
            return
        self._spawn("kwok", [
            str(binary("kwok")), "--kubeconfig", str(self.kubeconfig),
            "--config", str(HERE / "stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
            "--node-ip", NODE_IP, "--cidr", POD_CIDR,
            "--node-lease-duration-seconds", "40",
            # kwok's own kubelet-like HTTP server is not needed; bind it to loopback anyway.
            "--server-address", f"127.0.0.1:{free_port()}",
        ])  # fmt: skip
        for node in self.nodes:
            self.apply(node.manifest())
        names = [n.name for n in self.nodes]
        wait_until("kwok nodes Ready", lambda: self._check_alive() or self._nodes_ready(names), timeout=60)

    def _start_real_nodes(self) -> None:
        if not self.real_nodes:
            return
        self.kubectl("apply", "-f", "-", stdin=real.REAL_NODES_RBAC)
        crt, key = real.client_cert(self.pki, "coredns", "/CN=system:coredns")
        server = f"https://{real.HOST_IP}:{self.api_port}"
        dns_kubeconfig = real.write_kubeconfig(
            self.workdir / "coredns.kubeconfig", server, self.pki / "ca.crt", crt, key
        )
        (self.workdir / "Corefile").write_text(real.corefile(dns_kubeconfig))
        self._spawn("coredns", [real.testbed_binary("coredns", "coredns"), "-conf", str(self.workdir / "Corefile")])
        for node in self.real_nodes:
            self.start_real_node(node)
        self.wait_real_nodes_ready([n.name for n in self.real_nodes])

    def node_dir(self, name: str) -> Path:
        """A real node's directory in the work dir: its configs, sockets, logs and import marker."""
        return self.workdir / "nodes" / name

    def wait_real_nodes_ready(self, names: list[str], timeout: float = 180, import_timeout: float = 1200) -> None:
        """Until the nodes are Ready; a node process that exited fails the wait with its log's name.

        First until each node's containerd holds the images (instant when its root is cached; a cold
        one imports 4 GB, minutes when the machine is busy), then ``timeout`` for the rest."""
        markers = [self.node_dir(name) / real.IMAGES_IMPORTED for name in names]
        wait_until(
            f"the images imported into real nodes {', '.join(names)} (cold: minutes)",
            lambda: self._check_alive() or all(m.exists() for m in markers),
            timeout=import_timeout,
            interval=1,
        )
        wait_until(f"real nodes {', '.join(names)} Ready", lambda: self._check_alive() or self._nodes_ready(names),
                   timeout=timeout)  # fmt: skip

    def start_real_node(self, node: real.RealNode) -> None:
        """Start (or start again, after reclaim_real_node) one real node and its processes."""
        assert self.fabric is not None
        node_dir = self.node_dir(node.name)
        longest_socket = max(real.containerd_sockets(node_dir), key=lambda path: len(bytes(path)))
        if len(bytes(longest_socket)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{longest_socket} is longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes): "
                "containerd could not listen there; use a shorter work directory (--dir)"
            )
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / real.IMAGES_IMPORTED).unlink(missing_ok=True)  # a node started again imports (or checks) anew
        (node_dir / "pod-logs").mkdir(exist_ok=True)
        # containerd's root (images, unpacked layers) is cached per node name: a warm start imports
        # nothing. Its runtime state stays in the work dir.
        root = CACHE / "nodes" / node.name / "containerd-root"
        root.mkdir(parents=True, exist_ok=True)
        images = real.images_manifest()
        cni_dir = node_dir / "cni"
        cni_dir.mkdir(exist_ok=True)
        (cni_dir / "10-spotray.conflist").write_text(json.dumps(real.cni_config(node), indent=2))
        (node_dir / "containerd.toml").write_text(
            real.containerd_config(node_dir, root, cni_dir, images["pause"]["ref"], node.address)
        )
        server = f"https://{real.HOST_IP}:{self.api_port}"
        ca = self.pki / "ca.crt"
        crt, key = real.client_cert(self.pki, f"node-{node.name}", f"/O=system:nodes/CN=system:node:{node.name}")
        kubelet_kubeconfig = real.write_kubeconfig(node_dir / "kubelet.kubeconfig", server, ca, crt, key)
        crt, key = real.client_cert(self.pki, f"proxy-{node.name}", "/CN=system:kube-proxy")
        proxy_kubeconfig = real.write_kubeconfig(node_dir / "kube-proxy.kubeconfig", server, ca, crt, key)
        (node_dir / "kubelet.yaml").write_text(yaml.safe_dump(real.kubelet_config(node, node_dir, ca)))
        (node_dir / "kube-proxy.yaml").write_text(yaml.safe_dump(real.kube_proxy_config(node, proxy_kubeconfig)))
        labels = ",".join(f"{k}={v}" for k, v in {**node.labels, "spotray.io/testbed-node": "real"}.items())
        token_file = node_dir / "network-policy-agent.token"
        token = self.kubectl("create", "token", "kube-network-policies", "-n", "kube-system", "--duration=24h")
        token_file.touch(mode=0o600)
        token_file.write_text(token.stdout.strip())
        config = {
            "node_dir": str(node_dir),
            "containerd": real.testbed_binary("containerd", "containerd"),
            "ctr": real.testbed_binary("containerd", "ctr"),
            "containerd_root": str(root),
            "images": images,
            "kubelet_argv": [
                real.testbed_binary("kubenode", "kubelet"), "--config", str(node_dir / "kubelet.yaml"),
                "--kubeconfig", str(kubelet_kubeconfig), "--hostname-override", node.name,
                "--node-ip", node.address, "--node-labels", labels,
                "--root-dir", str(node_dir / "kubelet"), "--cert-dir", str(node_dir / "pki"), "--v", "1",
            ],
            "kube_proxy_argv": [
                real.testbed_binary("kubenode", "kube-proxy"), "--config", str(node_dir / "kube-proxy.yaml"),
            ],
            # Enforces NetworkPolicies on the node's pods (nodes.network_policy_rules says how).
            "network_policy_agent": {
                "argv": [
                    real.testbed_binary("netpol", "kube-network-policies"), "--hostname-override", node.name,
                    "--nfqueue-id", str(real.NETWORK_POLICY_QUEUE),
                    # Kernels from 6.12 on fixed the DNS race that workaround is for (this one is newer).
                    "--netfilter-bug-1766-fix=false",
                    # Pod addresses from the API server, not as an NRI plugin of containerd (one takes
                    # part in every pod's start); a pod's first packets may come before the API has
                    # its address, are dropped, and its retries pass.
                    "--disable-nri",
                    "--metrics-bind-address", "127.0.0.1:9080",  # the node's own loopback
                ],
                "env": {"KUBERNETES_SERVICE_HOST": real.HOST_IP, "KUBERNETES_SERVICE_PORT": str(self.api_port)},
                "token_file": str(token_file),
                "ca_file": str(ca),
                "pod_supernet": real.POD_SUPERNET,
            },
        }  # fmt: skip
        (node_dir / "node.json").write_text(json.dumps(config, indent=2))
        real.prepare_cgroup_root(node.cgroup_root)
        netns = self.fabric.add_node(node, self.real_nodes)
        self._spawn(f"node-{node.name}", [
            "nsenter", f"--net=/run/netns/{netns}", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            sys.executable, str(HERE / "nodes.py"), str(node_dir / "node.json"),
        ])  # fmt: skip

    def stop_real_node(self, node: real.RealNode) -> None:
        """Stop a node at once, as when its VM is gone: processes, containers, cgroups, namespace."""
        assert self.fabric is not None
        proc = self.procs.pop(f"node-{node.name}", None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        real.kill_cgroup_processes(node.cgroup_root)
        # containerd's shims re-parent themselves out of the node's process group; they carry
        # the marker in their environment and the node's config path on their command line.
        node_dir = str(self.node_dir(node.name))
        kill_pids([pid for pid in marked_processes(self.marker) if node_dir in _cmdline(pid)])
        real.remove_cgroup_tree(node.cgroup_root)
        self.fabric.remove_node(node)

    def reclaim_real_node(self, name: str, timeout: float = 120) -> list[str]:
        """A spot reclaim the way a cloud does it, on a real node.

        The notice: the node is tainted (no new pods) and its pods are evicted through the
        Eviction API with their own grace period, so preStop hooks and SIGTERM handlers run in
        real containers. Then the VM goes: kubelet, containers and network stop, and the Node
        object is deleted. Returns the pods (namespace/name) that were on it.
        """
        node = next(n for n in self.real_nodes if n.name == name)
        pods = json.loads(self.kubectl("get", "pods", "-A", "-o", "json",
                                       "--field-selector", f"spec.nodeName={name}").stdout)["items"]  # fmt: skip
        self.kubectl("taint", "node", name, f"{SPOT_TAINT_KEY}-reclaimed=true:NoSchedule", "--overwrite")
        # Through the Eviction API, as a cloud's termination handler does: the pods carry DisruptionTarget
        # (EvictionByEvictionAPI), which the controller's pod watcher reads. A plain delete sets none.
        self.kubectl("drain", name, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                     f"--timeout={int(timeout)}s", check=False)  # fmt: skip
        self.stop_real_node(node)
        self.kubectl("delete", "node", name, "--wait=false", check=False)
        for pod in pods:
            meta = pod["metadata"]
            self.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--force", "--grace-period=0",
                         check=False)  # fmt: skip
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]

    def lose_real_node(self, name: str) -> list[str]:
        """A real node lost without notice, its VM gone at once: kubelet, containers and network stop,
        then what the cloud's node controller does (``preempt_node``: the pods marked DisruptionTarget,
        the Node and the pods deleted). Returns the pods (namespace/name) that were on it."""
        self.stop_real_node(next(n for n in self.real_nodes if n.name == name))
        return self.preempt_node(name)

    def _nodes_ready(self, names: list[str]) -> bool:
        out = self.kubectl("get", "nodes", "-o", "json").stdout
        ready = {
            item["metadata"]["name"]
            for item in json.loads(out)["items"]
            for c in item["status"].get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        }
        return set(names) <= ready

    def _start_kuberay(self) -> None:
        # Server-side apply: the RayCluster CRD is too large for client-side apply's annotation.
        self.kubectl("apply", "--server-side", *(f"--filename={crd}" for crd in kuberay_crds()))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        self.hosts_file.write_text(self._hosts_text({}))
        if not self.ray_heads_file.exists():
            self.ray_heads_file.write_text(json.dumps({}))
        self._spawn("ray-bridge", [
            sys.executable, "-m", "testbed.cluster", "bridge",
            "--kubeconfig", str(self.kubeconfig),
            "--hosts", str(self.hosts_file), "--ray-heads", str(self.ray_heads_file),
        ])  # fmt: skip
        operator = [
            str(binary("ray-operator")),
            "--enable-leader-election=false",
            "--metrics-addr",
            "0",
            "--health-probe-bind-address",
            "0",
            "--log-stdout-encoder",
            "console",
        ]
        # The operator dials http://<head-svc>.<ns>.svc.cluster.local:8265. It runs in a private
        # mount namespace whose /etc/hosts is our hosts file, so those names resolve to the local
        # Ray heads for it alone; see docs/testbed.md ("The Ray bridge"). Its resolv.conf points
        # at loopback too, so a name the bridge does not know fails here instead of reaching the
        # machine's DNS server.
        # With real nodes, the cluster's own DNS (CoreDNS on the fabric) answers those names with
        # the head pods' addresses, which the host reaches through the fabric.
        resolv_conf = self.workdir / "resolv.conf"
        nameserver = real.HOST_IP if self.real_nodes else "127.0.0.1"
        resolv_conf.write_text(f"nameserver {nameserver}\noptions timeout:1 attempts:1\n")
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare[1:1] = ["--user", "--map-root-user"]
        mounts = 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
        self._spawn("ray-operator", [
            *unshare, "sh", "-c", mounts, str(self.hosts_file), str(resolv_conf), *operator,
        ], env={"KUBECONFIG": str(self.kubeconfig)})  # fmt: skip
        wait_until(
            "the KubeRay operator to start its controllers",
            lambda: self._check_alive() or "Starting workers" in self.log_tail("ray-operator", 200),
            timeout=60,
        )

    @staticmethod
    def _hosts_text(names: dict[str, str]) -> str:
        base = Path("/etc/hosts").read_text()
        lines = [f"{ip} {name}" for name, ip in sorted(names.items())]
        return base.rstrip("\n") + "\n# spotray test bed: Ray head services\n" + "\n".join(lines) + "\n"

    # -- helpers for tests --------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment for a process that should talk to this cluster (e.g. a kopf operator)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply(self, *manifests: dict[str, Any], namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=yaml.safe_dump_all(manifests))

    def bridge(self, namespace: str, ray_cluster: str, address: str) -> None:
        """Route the operator's traffic for one RayCluster's head to the Ray head at address."""
        heads = json.loads(self.ray_heads_file.read_text())
        heads[f"{namespace}/{ray_cluster}"] = address
        _write_in_place(self.ray_heads_file, json.dumps(heads, indent=2))

    def bridge_ray_job(self, namespace: str, ray_job: str, address: str, timeout: float = 60) -> str:
        """Route the RayCluster a RayJob creates (its name is generated) to the Ray head at address.

        Call it right after creating the RayJob: the operator submits only once the cluster is
        ready. Returns the RayCluster's name.
        """

        def cluster_name() -> str:
            out = self.kubectl("get", "rayjob", ray_job, "-n", namespace, "-o", "jsonpath={.status.rayClusterName}")
            return out.stdout.strip()

        name: str = wait_until(f"RayJob {ray_job}'s RayCluster name", cluster_name, timeout=timeout)
        self.bridge(namespace, name, address)
        return name

    def default_ray_head(self) -> str | None:
        """Where RayClusters without their own bridge entry go (None: nowhere)."""
        default = json.loads(self.ray_heads_file.read_text()).get("default")
        return str(default) if default is not None else None

    def set_default_ray_head(self, address: str | None) -> None:
        """Route every RayCluster without its own bridge entry to the Ray head at address."""
        heads = json.loads(self.ray_heads_file.read_text())
        if address is None:
            heads.pop("default", None)
        else:
            heads["default"] = address
        _write_in_place(self.ray_heads_file, json.dumps(heads, indent=2))

    def preempt_node(self, name: str) -> list[str]:
        """What a cloud does to a spot VM: mark its pods DisruptionTarget, then delete them and the node.

        Returns the names (namespace/name) of the pods that were on the node.
        """
        pods = json.loads(self.kubectl("get", "pods", "-A", "-o", "json",
                                       "--field-selector", f"spec.nodeName={name}").stdout)["items"]  # fmt: skip
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                     "message": "spot instance reclaimed", "lastTransitionTime": now}  # fmt: skip
        for pod in pods:
            meta = pod["metadata"]
            patched = self.kubectl("patch", "pod", meta["name"], "-n", meta["namespace"], "--subresource", "status",
                                   "--type", "strategic", "-p", json.dumps({"status": {"conditions": [condition]}}),
                                   check=False)  # fmt: skip
            # A pod that is already gone needs no notice; anything else is a real failure.
            if patched.returncode != 0 and "NotFound" not in patched.stderr:
                raise RuntimeError(f"marking {meta['name']} DisruptionTarget failed: {patched.stderr.strip()}")
        self.kubectl("delete", "node", name, "--wait=false")
        for pod in pods:
            meta = pod["metadata"]
            # The kubelet is gone with the VM, so nobody would confirm the deletion: force it.
            self.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--force", "--grace-period=0",
                         check=False)  # fmt: skip
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]

    def restart_apiserver(self, down_s: float) -> None:
        """Lose the API server: SIGKILL it, keep it down ``down_s`` seconds, start it again.

        Same port, certificates and etcd, so every client (controllers, kwok, tests) reconnects to
        the same address and finds the same objects, as after a control-plane crash.
        """
        self.restart("kube-apiserver", down_s)
        wait_until("kube-apiserver /readyz after its restart", lambda: self._check_alive() or self._readyz(), 120)

    def restart(self, name: str, down_s: float) -> None:
        """SIGKILL one component (``kube-apiserver``, ``ray-operator``, ``kwok``...) with its children,
        keep it down ``down_s`` seconds, and start it again with the same command."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(down_s)
        self._spawn(name, *self.commands[name])

    def pause(self, name: str) -> None:
        """SIGSTOP one component: its ports still accept connections (the kernel's backlog), and
        nothing answers; ``resume`` lets it go on where it stopped."""
        os.killpg(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGCONT)

    def add_node(self, node: Node) -> None:
        self.apply(node.manifest())
        wait_until(f"node {node.name} Ready", lambda: self._nodes_ready([node.name]), timeout=60)

    def restore_node(self, name: str) -> None:
        """Bring back a node of the test bed's own set (after preempt_node): fresh capacity."""
        self.add_node(next(node for node in self.nodes if node.name == name))

    # -- stop ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every process group we started, then anything else carrying our marker.

        SIGTERM first, then SIGKILL after two seconds: the apiserver and etcd would otherwise
        spend many seconds draining watches, and every byte of their state is thrown away anyway.
        """
        for node in self.real_nodes:
            if f"node-{node.name}" in self.procs:
                self.stop_real_node(node)
        for proc in reversed(list(self.procs.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wait_until("test bed processes to exit", lambda: _kill_marked(self.marker), timeout=15)
        self.procs.clear()
        if self.fabric:
            for node in self.real_nodes:
                real.remove_cgroup_tree(node.cgroup_root)
                self.fabric.remove_node(node)
            self.fabric.down()

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_marked(marker: str) -> bool:
    pids = marked_processes(marker)
    kill_pids(pids)
    return not pids


def _write_in_place(path: Path, text: str) -> None:
    """Rewrite without replacing the inode: the operator's /etc/hosts is a bind mount of it."""
    with path.open("r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


# -- Ray heads --------------------------------------------------------------------------------


RAY_STARTED = "Ray runtime started."  # what `ray start` prints once its node registered (ray/scripts/scripts.py)


class RayHead:
    """A real `ray start --head` on a loopback address, for the bridge.

    The dashboard listens on address:8265 (the port KubeRay's head Service names `dashboard`),
    and the GCS on a free port. Jobs run on this machine with the venv's Python first on PATH.
    """

    def __init__(
        self,
        workdir: Path,
        address: str = "",
        num_cpus: int = 2,
        marker: str = "",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        # What a pod's environment would give the job (S3 endpoint and keys, PYTHONPATH of the image).
        self.extra_env = dict(extra_env or {})
        # Two test sessions at once (two engineers, or CI beside a developer) each get their own.
        self.address = address or free_ray_head_address()
        self.num_cpus = num_cpus
        self.marker = marker or f"{os.getpid()}:{workdir}"
        self.dashboard_url = f"http://{self.address}:{RAY_DASHBOARD_PORT}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.temp_dir: Path | None = None
        self.gcs_address = ""  # host:port, once started
        self.env: dict[str, str] = {}
        self.session: tuple[int, int | None] | None = None  # `ray start`'s session: its pid and start time
        self.nodes: list[LocalRayWorkerNode] = []
        self._log_start = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"ray-head-{self.address}.log"

    def start(self, tries: int = 3) -> RayHead:
        """Start the head; a `ray start` that dies while starting up is started again, up to ``tries``.

        On a loaded machine Ray's own start-up can give up: the raylet must register with the GCS
        within 30 s (hard-coded in ray/_private/node.py), and a CI run once lost its session's head
        that way ("The current node timed out during startup"), failing every test that used it.
        A head that died starting is a transient fault of the test bed, not of what is under test.
        """
        for attempt in range(1, tries + 1):
            try:
                return self._start_once()
            except ProcessDiedError as died:
                log_tail = self.log_path.read_text(errors="replace")[-600:]
                if attempt == tries:
                    raise ProcessDiedError(f"{died}, {tries} times; the last log lines:\n{log_tail}") from died
                print(f"Ray head on {self.address}: {died} while starting up (try {attempt} of {tries}); again")
        raise AssertionError("unreachable")

    def _start_once(self) -> RayHead:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log_start = len(self.log_path.read_text(errors="replace")) if self.log_path.exists() else 0  # this try's
        self.temp_dir = Path(tempfile.mkdtemp(prefix=RAY_TEMP_PREFIX, dir=RAY_TEMP_ROOT))
        (self.temp_dir / "owner").write_text(str(os.getpid()))
        venv_bin = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
            MARKER: self.marker,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray 2.60 turns token auth on for any cluster this user starts once ~/.ray/auth_token
            # exists, and any plain ray.init() on the machine writes that file: the tests' HTTP calls
            # to the dashboard then get 401. The test bed's head is a pod stand-in with auth off.
            "RAY_AUTH_MODE": "disabled",
            # gloo (torch.distributed on CPU, Ray Train's default) binds to the host name's
            # interface unless told otherwise; keep its traffic on loopback.
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",  # its "Ray runtime started." reaches the log as it is printed
            **self.extra_env,
        }
        env.pop("RAY_ADDRESS", None)
        names = ("port", "client", "agent", "agent-grpc", "metrics", "runtime")
        ports = {name: str(port) for name, port in zip(names, free_ports(len(names)), strict=True)}
        self.env, self.gcs_address = env, f"{self.address}:{ports['port']}"
        argv = [
            str(Path(venv_bin) / "ray"), "start", "--head", "--block",
            "--node-ip-address", self.address, "--dashboard-host", self.address,
            "--dashboard-port", str(RAY_DASHBOARD_PORT),
            "--port", ports["port"], "--ray-client-server-port", ports["client"],
            "--dashboard-agent-listen-port", ports["agent"], "--dashboard-agent-grpc-port", ports["agent-grpc"],
            "--metrics-export-port", ports["metrics"], "--runtime-env-agent-port", ports["runtime"],
            "--num-cpus", str(self.num_cpus), "--temp-dir", str(self.temp_dir), "--disable-usage-stats",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = popen_dying_with_us(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.session = (self.proc.pid, start_time(self.proc.pid))
        try:
            wait_until(f"Ray dashboard at {self.dashboard_url}", self._jobs_api_up, timeout=120, interval=1)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker_node(self, num_cpus: int, host: str = RAY_WORKER_NODE_IP) -> LocalRayWorkerNode:
        """Join one more Ray node to this head, on a loopback address of its own: a worker pod's machine.

        ``kill()`` on it is that machine vanishing; it is stopped with the head if still up.
        """
        assert self.temp_dir is not None, "the Ray head is not running"
        node = LocalRayWorkerNode(self.gcs_address, self.env, self.workdir, num_cpus, host)
        self.nodes.append(node)
        return node.start()

    def kill_job(self, submission_id: str) -> list[int]:
        """SIGKILL a Ray job's entrypoint, as if its machine vanished; Ray then marks it FAILED.

        The entrypoint (and every process it starts) holds the job's driver log open, which is
        how it is found. For a RayJob the submission id is `status.jobId`. Returns the pids killed.
        """
        pids = self.job_pids(submission_id)
        kill_pids(pids)
        return pids

    def job_pids(self, submission_id: str) -> list[int]:
        """The pids of a Ray job's entrypoint and every process it starts (they hold its driver log open)."""
        assert self.temp_dir is not None, "the Ray head is not running"
        log = self.temp_dir / "session_latest" / "logs" / f"job-driver-{submission_id}.log"
        # Only the entrypoint's processes: Ray's own (titled "ray::...") may have the log open too.
        return [pid for pid in processes_using(log.resolve()) if not _cmdline(pid).startswith("ray::")]

    def _jobs_api_up(self) -> bool:
        """Up: `ray start` said so (its raylet registered; the dashboard alone comes up before that,
        and a head whose raylet then timed out served the jobs API and ran no job) and the jobs API answers."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessDiedError(f"ray start exited with {self.proc.returncode}")
        log = self.log_path.read_text(errors="replace")
        if RAY_STARTED not in log[self._log_start :]:
            return False
        with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

        # Ray's workers leave the process group (the marker finds them), and its agents hide the
        # marker (their open log files in the temp dir find them). An agent whose raylet died
        # before it opened its logs has neither, and the SIGTERM above is all it got when `ray
        # start` was already gone; it is still in `ray start`'s session (the nemesis campaign
        # found such agents of failed starts running on, the load growing with each).
        def all_gone() -> bool:
            pids = marked_processes(self.marker) + self._session_processes()
            if self.temp_dir is not None:
                pids += processes_using(self.temp_dir)
            kill_pids(pids)
            return not pids

        wait_until("Ray processes to exit", all_gone, timeout=15)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _session_processes(self) -> list[int]:
        if self.session is None:
            return []
        leader, started = self.session
        if start_time(leader) not in (None, started):
            return []  # the leader's pid now names another process: the session is no longer ours
        # Linux keeps a session's id from being reused while any process is still in that session,
        # so its members are the leader's own even after it died and its children were reparented.
        return session_members(leader)

    def __enter__(self) -> RayHead:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the bridge process -----------------------------------------------------------------------


def run_bridge(kubeconfig: Path, hosts: Path, ray_heads: Path) -> None:
    """Plays cluster DNS for the operator: `<head-svc>.<ns>.svc.cluster.local` -> a Ray head.

    Polls KubeRay's head Services; a RayCluster maps to ray-heads.json's "<ns>/<cluster>" entry,
    else to its "default" entry, else to nothing (the operator then sees a DNS failure, as it
    would for a head that never came up).
    """
    from kubernetes import client, config  # noqa: PLC0415 - only the bridge process needs it

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    current = ""
    while True:
        try:
            heads = json.loads(ray_heads.read_text() or "{}")
            services = api.list_service_for_all_namespaces(label_selector="ray.io/node-type=head").items
        except Exception as e:  # noqa: BLE001 - keep serving through apiserver hiccups
            print(f"bridge: {e}", flush=True)
            time.sleep(1)
            continue
        names = {}
        for svc in services:
            cluster = (svc.metadata.labels or {}).get("ray.io/cluster", "")
            address = heads.get(f"{svc.metadata.namespace}/{cluster}", heads.get("default"))
            if address:
                names[f"{svc.metadata.name}.{svc.metadata.namespace}.svc.{CLUSTER_DOMAIN}"] = address
        text = Testbed._hosts_text(names)
        if text != current:
            _write_in_place(hosts, text)
            current = text
            print(f"bridge: {json.dumps(names)}", flush=True)
        time.sleep(0.5)


# -- command line (make cluster-up / cluster-down) --------------------------------------------

DEFAULT_DIR = Path(tempfile.gettempdir()) / "spotray-testbed"


def _up(workdir: Path, with_ray: bool) -> None:
    """Runs as a detached supervisor: starts everything, then sleeps until SIGTERM."""
    testbed = Testbed(workdir)
    ray = RayHead(workdir / "ray", address=CLUSTER_UP_RAY_HEAD_IP, marker=testbed.marker) if with_ray else None
    stopping = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        testbed.start()
        if ray is not None:
            ray.start()
            testbed.set_default_ray_head(ray.address)
        (workdir / "ready").write_text(str(testbed.kubeconfig))
        while not stopping:
            time.sleep(0.5)
    finally:
        if ray is not None:
            ray.stop()
        testbed.stop()
        (workdir / "supervisor.pid").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a test bed in the background and print its KUBECONFIG")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    up.add_argument("--no-ray", action="store_true", help="do not start a local Ray head for the bridge")
    up.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    down = sub.add_parser("down", help="stop the test bed started by `up`")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    bridge = sub.add_parser("bridge", help=argparse.SUPPRESS)
    bridge.add_argument("--kubeconfig", type=Path, required=True)
    bridge.add_argument("--hosts", type=Path, required=True)
    bridge.add_argument("--ray-heads", type=Path, required=True)
    args = parser.parse_args()

    if args.command == "bridge":
        run_bridge(args.kubeconfig, args.hosts, args.ray_heads)
    elif args.command == "up" and args.foreground:
        _up(args.dir, with_ray=not args.no_ray)
    elif args.command == "up":
        pid_file = args.dir / "supervisor.pid"
        if pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists():
            sys.exit(f"a test bed is already running in {args.dir}: make cluster-down first")
        shutil.rmtree(args.dir, ignore_errors=True)
        args.dir.mkdir(parents=True)
        argv = [sys.executable, "-m", "testbed.cluster", "up", "--dir", str(args.dir), "--foreground"]
        if args.no_ray:
            argv.append("--no-ray")
        with (args.dir / "supervisor.log").open("ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=REPO)  # fmt: skip
        pid_file.write_text(str(proc.pid))
        try:
            wait_until("the test bed", lambda: proc.poll() is not None or (args.dir / "ready").exists(), timeout=300)
        except TimeoutError:
            os.kill(proc.pid, signal.SIGTERM)
            raise
        if proc.poll() is not None:
            sys.exit(f"the test bed failed to start; see {args.dir}/supervisor.log and {args.dir}/logs/")
        print(f"test bed up; logs in {args.dir}/logs\n\nexport KUBECONFIG={args.dir / 'kubeconfig'}")
    elif args.command == "down":
        pid_file = args.dir / "supervisor.pid"
        if not pid_file.exists():
            print(f"no test bed running in {args.dir}")
            return
        pid = int(pid_file.read_text().strip())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        # Ended, not gone: a supervisor whose parent has not reaped it yet (a zombie) has stopped.
        wait_until("the test bed to stop", lambda: not is_running(pid), timeout=60)
        pid_file.unlink(missing_ok=True)
        print(f"test bed in {args.dir} stopped")


if __name__ == "__main__":
    main()
