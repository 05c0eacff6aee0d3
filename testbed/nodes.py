"""Real Kubernetes nodes for the test bed: kubelet + containerd + kube-proxy running real containers.

Each node is a network namespace of its own and a private mount namespace, holding containerd (with
Debian's runc and the CNI bridge plugin), the kubelet and kube-proxy. Nodes meet on a "fabric": an
L2 bridge inside one more network namespace. Nothing here has an uplink or a default route:

    host (198.18.254.254: kube-apiserver, CoreDNS)
      |  veth
    fabric netns: bridge br0 (L2 only)
      |  veth                       |  veth
    node 1 netns (198.18.254.1)    node 2 netns (198.18.254.2)
      cni0 198.18.1.1/24             cni0 198.18.2.1/24
      pods 198.18.1.x                pods 198.18.2.x

Services get ClusterIPs in 198.19.0.0/16 (kube-proxy's iptables rules live inside each node's
namespace). The host keeps ip_forward off and its own iptables untouched: it only sends and
receives on its fabric address. CoreDNS answers cluster.local and nothing else.

The kubelet would rewrite three kernel settings (vm.overcommit_memory, kernel.panic,
kernel.panic_on_oops). In the node's private mount namespace those /proc/sys files are covered by
plain files, so it writes there and the machine's settings never change. Pods' cgroups go under
/spotray-<node> in every hierarchy (the kubelet's cgroupRoot), so two kubelets never see each
other's pods and teardown finds everything; see stop_node().
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HOST_IP = "198.18.254.254"
FABRIC_PREFIX = "198.18.254"
# Pods of node i live in 198.18.<i>.0/24 (i from 1); Services in 198.19.0.0/16.
POD_SUPERNET = "198.18.0.0/20"
SERVICE_CIDR = "198.19.0.0/16"
# Everything on real nodes stays in 198.18.0.0/15 (RFC 2544, set aside for benchmark networks).
ALLOWED_NETWORK = ipaddress.ip_network("198.18.0.0/15")
CLUSTER_DOMAIN = "cluster.local"
NETNS_PREFIX = "spotray-tb"
# The kernel settings the kubelet would change; a test checks they stay as they were.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Debian's containernetworking-plugins (bridge, host-local, portmap, loopback).
CNI_BIN = "/usr/lib/cni"
# The NetworkPolicy agent (kube-network-policies) judges the first packet of each connection to or
# from a pod in userspace, from this NFQUEUE; see network_policy_rules().
NETWORK_POLICY_QUEUE = 100
NETWORK_POLICY_CHAIN = "SPOTRAY-NETPOL"
# Where an in-cluster client reads its ServiceAccount token and CA (client-go's InClusterConfig; the
# agent takes no kubeconfig). In a node's mount namespace /run is its own tmpfs.
SERVICE_ACCOUNT_DIR = Path("/run/secrets/kubernetes.io/serviceaccount")
# Written in the node's directory once its containerd holds every image: a cold import of the
# project's 3.7 GB image takes minutes on a busy machine, and readiness is waited for only after it.
IMAGES_IMPORTED = "images-imported"
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "spotray" / "testbed"))


def versions() -> dict[str, str]:
    """The pinned versions from versions.env, the one place that names them."""
    result = {}
    for raw in (HERE / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            result[key] = value
    return result


def sh(*argv: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    if netns:
        argv = ("ip", "netns", "exec", netns, *argv)
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def kernel_settings() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS}


def cgroup_hierarchies() -> list[Path]:
    """Every cgroup hierarchy of this machine (v1 controllers, the named systemd one, cgroup2)."""
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


@dataclass
class RealNode:
    """One real node: its name, labels, taints, and its index on the fabric (1, 2, ...)."""

    name: str
    index: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{FABRIC_PREFIX}.{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"198.18.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        return f"/spotray-{self.name}"


class Fabric:
    """The network namespaces and links of one test bed, named after its owner's pid."""

    def __init__(self, owner_pid: int) -> None:
        self.tag = f"{NETNS_PREFIX}{owner_pid}"
        self.netns = f"{self.tag}-fabric"
        self.host_link = f"srh{owner_pid}"

    def node_netns(self, node: RealNode) -> str:
        return f"{self.tag}-{node.name}"

    def up(self) -> None:
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "set", "lo", "up", netns=self.netns)
        sh("ip", "link", "add", "br0", "type", "bridge", netns=self.netns)
        sh("ip", "link", "set", "br0", "up", netns=self.netns)
        peer = f"srf{os.getpid()}"
        sh("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", self.netns)
        sh("ip", "link", "set", peer, "master", "br0", "up", netns=self.netns)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", self.host_link)
        sh("ip", "link", "set", self.host_link, "up")

    def add_node(self, node: RealNode, all_nodes: list[RealNode]) -> str:
        netns = self.node_netns(node)
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "set", "lo", "up", netns=netns)
        outer, inner = f"sr{node.index}o{os.getpid()}", f"sr{node.index}i{os.getpid()}"
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", outer, "netns", self.netns)
        sh("ip", "link", "set", outer, "master", "br0", "up", netns=self.netns)
        sh("ip", "link", "set", inner, "netns", netns)
        sh("ip", "link", "set", inner, "name", "eth0", netns=netns)
        sh("ip", "addr", "add", f"{node.address}/24", "dev", "eth0", netns=netns)
        sh("ip", "link", "set", "eth0", "up", netns=netns)
        # The node routes between its pods' bridge and the fabric (inside its own namespace).
        sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", netns=netns)
        for other in all_nodes:
            if other.index != node.index:
                sh("ip", "route", "replace", other.pod_cidr, "via", other.address, netns=netns)
        # The host reaches pods through the node they run on; Services through the first node.
        sh("ip", "route", "replace", node.pod_cidr, "via", node.address)
        if node.index == all_nodes[0].index:
            sh("ip", "route", "replace", SERVICE_CIDR, "via", node.address)
        return netns

    def remove_node(self, node: RealNode) -> None:
        sh("ip", "route", "del", node.pod_cidr, check=False)
        sh("ip", "netns", "del", self.node_netns(node), check=False)

    def down(self) -> None:
        sh("ip", "route", "del", SERVICE_CIDR, check=False)
        sh("ip", "link", "del", self.host_link, check=False)
        sh("ip", "netns", "del", self.netns, check=False)


def leftover_netns(tag: str = NETNS_PREFIX) -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


def leftover_links() -> list[str]:
    out = sh("ip", "-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(("srh", "srf")) and n[3:].isdigit()]


def leftover_cgroups() -> list[Path]:
    return [p for h in cgroup_hierarchies() for p in h.glob("spotray-*") if p.is_dir()]


def leftover_mounts() -> list[str]:
    """Mounts of containerd's, runc's or the kubelet's that leaked into the host's mount namespace."""
    mount_points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    markers = ("io.containerd.", "/kubelet/pods/", "/containerd-state/", "/run/containerd")
    return [m for m in mount_points if any(marker in m for marker in markers)]


def reap_orphans() -> list[str]:
    """Remove the nodes of test beds whose owner is dead (a test run SIGKILLed earlier): their
    containers (by cgroup), network namespaces and host links. Returns what it removed.

    A dead node's private mount namespace (and every container mount in it) went with its last
    process; its kernel settings were never changed.
    """
    removed = []
    live_nodes = set()
    for netns in leftover_netns():
        owner = netns[len(NETNS_PREFIX) :].partition("-")[0]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            live_nodes.add(netns.partition("-")[2].partition("-")[2])
            continue
        for pid in sh("ip", "netns", "pids", netns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "del", netns, check=False)
        removed.append(netns)
    for link in leftover_links():
        owner = link[3:]  # srh<pid>, srf<pid>
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            sh("ip", "link", "del", link, check=False)
            removed.append(link)
    # Routes through a deleted host link went with it.
    for cgroup in {p.name for p in leftover_cgroups()}:
        if cgroup.removeprefix("spotray-") not in live_nodes:
            kill_cgroup_processes(f"/{cgroup}")
            remove_cgroup_tree(f"/{cgroup}")
            removed.append(cgroup)
    return removed


def kill_cgroup_processes(root: str) -> int:
    """SIGKILL every process in the cgroup tree ``root`` in every hierarchy; return how many."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / root.lstrip("/")
        if base.is_dir():
            for procs in base.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def remove_cgroup_tree(root: str, timeout: float = 30) -> None:
    """rmdir the cgroup tree ``root`` in every hierarchy, deepest first, once its processes are gone."""
    deadline = time.monotonic() + timeout
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / root.lstrip("/")
        if not base.is_dir():
            continue
        children = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for directory in [*children, base]:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    kill_cgroup_processes(root)
                    time.sleep(0.2)


def prepare_cgroup_root(root: str) -> None:
    """Create the kubelet's cgroupRoot in every hierarchy (cpuset needs its cpus and mems set)."""
    for hierarchy in cgroup_hierarchies():
        base = hierarchy / root.lstrip("/")
        base.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                (base / name).write_text((hierarchy / name).read_text())


# -- configuration files ----------------------------------------------------------------------


def containerd_sockets(node_dir: Path) -> tuple[Path, Path]:
    """containerd's gRPC socket (the kubelet's runtime endpoint) and its ttrpc socket, in the node's directory."""
    return node_dir / "containerd.sock", node_dir / "containerd-ttrpc.sock"


def containerd_config(node_dir: Path, root: Path, cni_conf_dir: Path, pause_ref: str, address: str) -> str:
    grpc_socket, ttrpc_socket = containerd_sockets(node_dir)
    return f"""\
version = 3
root = "{root}"
state = "{node_dir / "containerd-state"}"

[grpc]
  address = "{grpc_socket}"

[ttrpc]
  address = "{ttrpc_socket}"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "{address}"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_ref}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # Pod network namespaces under the state dir, not /run/netns: nothing left there after a kill.
  netns_mounts_under_state_dir = true
  # The machine lacks CAP_SYS_RESOURCE: no process here may lower its oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{cni_conf_dir}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
"""


def cni_config(node: RealNode) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "spotray-testbed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                # No NAT: pods keep their addresses everywhere and nothing leaves the fabric.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr, "gateway": f"198.18.{node.index}.1"}]],
                    "routes": [{"dst": "198.18.0.0/15"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
        ],
    }


def kubelet_config(node: RealNode, node_dir: Path, ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "cgroupRoot": node.cgroup_root,
        "clusterDNS": [HOST_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "containerRuntimeEndpoint": f"unix://{containerd_sockets(node_dir)[0]}",
        "podLogsDir": str(node_dir / "pod-logs"),
        "staticPodPath": "",
        "registerWithTaints": node.taints,
        "failSwapOn": False,
        "serializeImagePulls": False,
        # Images are imported, never pulled; disk-based eviction and image GC would only get in the way.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": False,
    }


def kube_proxy_config(node: RealNode, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "hostnameOverride": node.name,
        "bindAddress": node.address,
        "clusterCIDR": POD_SUPERNET,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "metricsBindAddress": "",
        "healthzBindAddress": "",
        # Global (not per-namespace) conntrack settings: 0 leaves the machine's values alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def network_policy_rules(pod_supernet: str, queue: int = NETWORK_POLICY_QUEUE) -> list[list[str]]:
    """iptables arguments that hand the agent each new connection to or from a pod, in the node's namespace.

    kube-network-policies writes its own nft table in one transaction whose rules end in the nft
    `queue` expression, which this kernel lacks (CONFIG_NFT_QUEUE is not set and modules cannot be
    loaded): the whole table fails and the agent runs enforcing nothing. The xt NFQUEUE target
    works (through nft_compat), so these rules queue the same packets its table would, where its
    chain sits: mangle POSTROUTING, after a Service's DNAT, for routed and (br_netfilter) bridged
    traffic alike. Replies ride on their connection. What the node itself sends, such as the
    kubelet's probes, is not judged, as Cilium and Calico admit the local host. No --queue-bypass:
    with the agent gone, pods' new connections fail instead of passing unjudged (and the node stops).
    """
    chain, mangle = NETWORK_POLICY_CHAIN, ["-w", "-t", "mangle"]
    to_queue = ["-j", "NFQUEUE", "--queue-num", str(queue)]
    return [
        [*mangle, "-N", chain],
        [*mangle, "-A", chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        [*mangle, "-A", chain, "-m", "addrtype", "--src-type", "LOCAL", "-j", "RETURN"],
        [*mangle, "-A", chain, "-d", pod_supernet, *to_queue],
        [*mangle, "-A", chain, "-s", pod_supernet, *to_queue],
        [*mangle, "-A", "POSTROUTING", "-j", chain],
    ]


def queue_bound(queue: int = NETWORK_POLICY_QUEUE, table: Path = Path("/proc/net/netfilter/nfnetlink_queue")) -> bool:
    """Whether a process listens on NFQUEUE ``queue`` in this network namespace."""
    with contextlib.suppress(FileNotFoundError):
        return any(line.split()[:1] == [str(queue)] for line in table.read_text().splitlines())
    return False


def corefile(kubeconfig: Path) -> str:
    return f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {HOST_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods disabled
        ttl 5
    }}
}}
"""


def import_images(ctr: str, socket_path: Path, root: Path, images: dict[str, dict[str, str]]) -> None:
    """Import each image archive unless this containerd root already holds that image id.

    The root is cached per node name (see RealNodes), so a warm start imports nothing.
    """
    stamp = root / "spotray-imported.json"
    imported = json.loads(stamp.read_text()) if stamp.exists() else {}
    for name, image in images.items():
        if imported.get(name) == image["id"]:
            continue
        started = time.monotonic()
        archive_path = image["archive"]
        command = [ctr, "--address", str(socket_path), "-n", "k8s.io", "images", "import", "--local", archive_path]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        imported[name] = image["id"]
        stamp.write_text(json.dumps(imported))
        print(f"imported {archive_path} in {time.monotonic() - started:.1f}s", flush=True)


# -- the process that runs inside a node's namespaces -----------------------------------------


def accepts_connections(socket_path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
    return True


def started(name: str, proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float = 60) -> bool:
    """Wait until ``ready()``; False (and why, for the node's log) if ``proc`` exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            why = "exited" if proc.poll() is not None else f"was not ready after {timeout:.0f} s"
            print(f"{name} {why}; see {name}.log", flush=True)
            return False
        time.sleep(0.1)
    return True


def node_main(config_path: Path) -> None:
    """Run inside the node's network namespace and a fresh private mount namespace (see start_node).

    Covers the kernel settings the kubelet writes with plain files, starts containerd, waits for its
    socket, imports the images, starts the NetworkPolicy agent and queues pods' traffic to it, then
    the kubelet and kube-proxy, and stays until one of them exits or it is told to stop.
    """
    config = json.loads(config_path.read_text())
    node_dir = Path(config["node_dir"])
    shadow = node_dir / "sysctl"
    shadow.mkdir(exist_ok=True)
    for name in KUBELET_SYSCTLS:
        fake = shadow / name.replace("/", ".")
        fake.write_text((Path("/proc/sys") / name).read_text())
        subprocess.run(["mount", "--bind", str(fake), str(Path("/proc/sys") / name)], check=True)
    # containerd, its shims, runc, the CNI plugins and the kubelet also write to fixed paths
    # (/run/containerd, /var/lib/cni, /var/lib/kubelet/device-plugins, /var/log/containers):
    # in this mount namespace those trees are empty tmpfs, gone with the node.
    for path in ("/run", "/var/lib", "/var/log"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path], check=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (node_dir / f"{name}.log").open("ab")
        procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def stop(_signum: int = 0, _frame: object = None) -> None:
        for proc in reversed(list(procs.values())):
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    containerd_bin = Path(config["containerd"]).parent
    # Its own bin directory first: containerd must find its own runc shim, not an older one.
    path = f"{containerd_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    socket_path, ttrpc_socket = containerd_sockets(node_dir)
    # A node started again (a new spot VM with the old one's name) finds the killed containerd's
    # socket files still there: waiting for the file alone started the kubelet before containerd
    # listened, the kubelet exited on "connection refused" and the node never came back.
    for stale in (socket_path, ttrpc_socket):
        stale.unlink(missing_ok=True)
    spawn("containerd", [config["containerd"], "--config", str(node_dir / "containerd.toml")], env={"PATH": path})
    if not started("containerd", procs["containerd"], lambda: accepts_connections(socket_path)):
        stop()
    import_images(config["ctr"], socket_path, Path(config["containerd_root"]), config["images"])
    (node_dir / IMAGES_IMPORTED).touch()
    agent = config.get("network_policy_agent")
    if agent:  # before the kubelet: no pod starts on a node that does not yet enforce policies
        SERVICE_ACCOUNT_DIR.mkdir(parents=True)
        shutil.copy(agent["token_file"], SERVICE_ACCOUNT_DIR / "token")
        shutil.copy(agent["ca_file"], SERVICE_ACCOUNT_DIR / "ca.crt")
        spawn("kube-network-policies", agent["argv"], env=agent["env"])
        if not started("kube-network-policies", procs["kube-network-policies"], queue_bound):
            stop()
        for rule in network_policy_rules(agent["pod_supernet"]):
            subprocess.run(["iptables", *rule], check=True)
    spawn("kubelet", config["kubelet_argv"])
    spawn("kube-proxy", config["kube_proxy_argv"])
    while all(p.poll() is None for p in procs.values()):
        time.sleep(0.5)
    dead = [name for name, p in procs.items() if p.poll() is not None]
    print(f"{', '.join(dead)} exited; stopping the node", flush=True)
    stop()


# -- the node set, driven from the test bed's process ------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def client_cert(pki: Path, name: str, subject: str) -> tuple[Path, Path]:
    """A client certificate signed by the test bed's CA (pki/ca.crt, pki/ca.key)."""
    key, csr, crt, ext = (pki / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr))
    ext.write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
             "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(crt))  # fmt: skip
    return crt, key


def write_kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "user"}}],
        "current-context": "testbed",
    }))  # fmt: skip
    return path


# The rights of the real nodes' own services. CoreDNS reads Services, EndpointSlices and Namespaces,
# nothing else.
REAL_NODES_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: spotray-testbed:coredns}
rules:
  - apiGroups: [""]
    resources: [services, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: spotray-testbed:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: spotray-testbed:coredns}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: system:coredns}]
---
# The NetworkPolicy agent of every real node reads pods, namespaces and policies, nothing else.
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: spotray-testbed:kube-network-policies}
rules:
  - apiGroups: [""]
    resources: [pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: spotray-testbed:kube-network-policies}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: spotray-testbed:kube-network-policies}
subjects: [{kind: ServiceAccount, name: kube-network-policies, namespace: kube-system}]
---
# The API server's own client certificate, for logs, exec and port-forward through the kubelets.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: spotray-testbed:apiserver-kubelet}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
"""


def testbed_binary(component: str, name: str) -> str:
    """A binary that testbed/build.sh built, by component (versions.env names it)."""
    v = versions()
    version = {"kubenode": v["KUBERNETES_VERSION"], "containerd": v["CONTAINERD_VERSION"],
               "coredns": v["COREDNS_VERSION"], "netpol": v["KUBE_NETWORK_POLICIES_VERSION"]}[component]  # fmt: skip
    path = CACHE / f"{component}-{version}" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run make testbed")
    return str(path)


def images_manifest() -> dict[str, dict[str, str]]:
    path = CACHE / "images" / "images.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run make testbed (testbed/images.sh)")
    return dict(json.loads(path.read_text()))


if __name__ == "__main__":
    node_main(Path(sys.argv[1]))
