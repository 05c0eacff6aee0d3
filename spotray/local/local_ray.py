"""A Ray cluster on this machine, on a loopback address of its own, started and stopped as one unit.

Why not ``ray.init()`` or ``ray stop``: a cluster that ``ray.init()`` starts lives and dies with
one driver, but local mode must survive (and deliberately kill) drivers; and ``ray stop`` kills
every Ray process on the machine, including other people's. So we run ``ray start --head --block``
in a session of its own and kill that session.

Three details keep traffic on loopback: Ray rewrites ``127.0.0.1`` into the machine's network
address, so we use another loopback address (127.0.0.2 by default); gloo (torch.distributed on CPU)
binds to the host name's interface unless told ``GLOO_SOCKET_IFNAME=lo``; and the GCS listens on all
interfaces, so every port is picked free rather than left at Ray's defaults, which another cluster
may hold.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from spotray.contract.errors import SpotrayError
from spotray.train.processes.subprocesses import signal_session, start_in_own_session
from spotray.train.storage.local_s3 import free_ports

DEFAULT_HOST = "127.0.0.2"
# Ray's client server binds 127.0.0.1 whatever the node's address, so its port must be free there too: a
# port the kernel hands out on 127.0.0.2 can be another cluster's client server's on 127.0.0.1. Taken, the
# client server dies just after the head is up, and `ray start --block` takes the head down with it (CI:
# two local sweep trials started at once; the second's driver then waited for a GCS that was gone).
LOCALHOST = "127.0.0.1"
LOCALHOST_BOUND = ("ray-client-server",)
STARTUP_ATTEMPTS = 3
WORKER_PORTS = 100  # one per Ray worker process (actors, tasks, training workers) alive at once
# `ray start --block` does not exit on SIGTERM (measured: still there after 20 s). The cluster is
# stopped only once the driver has exited, with every checkpoint in S3, so a short grace for Ray's
# daemons to flush their logs is all it gets before SIGKILL.
STOP_GRACE_S = 2.0


class _EarlyExitError(Exception):
    def __init__(self, code: int, log_tail: str) -> None:
        super().__init__(code)
        self.code = code
        self.log_tail = log_tail


NODE_PORT_NAMES = (
    "node-manager",
    "object-manager",
    "runtime-env-agent",
    "metrics-export",
    "dashboard-agent-listen",
    "dashboard-agent-grpc",
)


def free_worker_port_range(host: str) -> int:
    """The lowest port of ``WORKER_PORTS`` consecutive ones that are free right now, from a random base."""
    rng = random.Random()  # noqa: S311 - spreading ports, not security
    for _ in range(50):
        low = rng.randrange(20000, 60000 - WORKER_PORTS)
        if all(_port_is_free(host, port) for port in range(low, low + WORKER_PORTS, 10)):
            return low
    raise SpotrayError("found no free range of ports for Ray's workers", "free some ports on the loopback interface")


def worker_ports(worker_low: int) -> range:
    return range(worker_low, worker_low + WORKER_PORTS)


def node_port_flags(
    host: str, worker_low: int, names: Sequence[str] = NODE_PORT_NAMES, taken: Collection[int] = ()
) -> list[str]:
    """``ray start`` flags for the worker range and every named port, each named one picked free on ``host``."""
    workers = worker_ports(worker_low)
    # `ray start` refuses a node whose named ports repeat or fall in its worker range (CI hit it once):
    # the kernel hands out free ports from the range the worker range is drawn from.
    picked = free_ports(len(names), host, avoid={*workers, *taken})
    for index, name in enumerate(names):
        if name in LOCALHOST_BOUND and not _port_is_free(LOCALHOST, picked[index]):
            picked[index] = _free_on_both(host, avoid={*workers, *taken, *picked})
    return [
        f"--min-worker-port={workers.start}",
        f"--max-worker-port={workers.stop - 1}",
        *(f"--{name}-port={port}" for name, port in zip(names, picked, strict=True)),
    ]


def _free_on_both(host: str, avoid: Collection[int]) -> int:
    """A port free on ``host`` and on 127.0.0.1 right now."""
    for _ in range(100):
        [port] = free_ports(1, host, avoid=avoid)
        if _port_is_free(LOCALHOST, port):
            return port
    raise SpotrayError(
        f"found no port free on both {host} and {LOCALHOST}", "free some ports on the loopback interface"
    )


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ray_executable() -> str:
    found = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not Path(found).exists():
        raise SpotrayError("the `ray` command is not installed", "run `make setup` (it installs ray[train])")
    return found


@dataclass
class LocalRayCluster:
    """``with LocalRayCluster(num_cpus=2) as ray_cluster:`` then ``RAY_ADDRESS=ray_cluster.address``."""

    num_cpus: int
    num_gpus: int = 0  # the GPUs Ray may hand out on the head (0: none, even on a machine that has some)
    host: str = DEFAULT_HOST
    startup_timeout_s: float = 90.0
    log_path: Path | None = None
    gcs_port: int = 0
    # Given to Ray's processes, so every worker has it, as a pod's env does on Kubernetes (S3 settings).
    env: dict[str, str] = field(default_factory=dict)
    # Called with the cluster's session id as soon as `ray start` exists (local mode's watchdog).
    on_launch: Callable[[int], None] | None = field(default=None, repr=False)
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="spotray-ray-", dir="/tmp")))
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _output: Path = field(default=Path("/dev/null"), init=False, repr=False)
    _nodes: list[LocalRayWorkerNode] = field(default_factory=list, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.gcs_port}"

    def start(self) -> LocalRayCluster:
        """Start the cluster; a port taken between our pick and Ray's bind costs a retry with new ports."""
        for attempt in range(1, STARTUP_ATTEMPTS + 1):
            self._launch()
            try:
                self._wait_ready()
            except _EarlyExitError as exited:
                if attempt == STARTUP_ATTEMPTS:
                    raise SpotrayError(
                        f"the local Ray cluster exited during startup (code {exited.code}), {attempt} times; "
                        f"its output ends with:\n{exited.log_tail}",
                        "a full disk or /tmp, or too little shared memory (/dev/shm), are common causes",
                    ) from None
                continue
            return self
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        worker_low = free_worker_port_range(self.host)
        [self.gcs_port] = free_ports(1, self.host, avoid=worker_ports(worker_low))
        command = [
            ray_executable(),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={self.host}",
            f"--port={self.gcs_port}",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            *node_port_flags(self.host, worker_low, [*NODE_PORT_NAMES, "ray-client-server"], taken=[self.gcs_port]),
        ]
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self._output = self.log_path or self.temp_dir / "ray-start.log"
        self._process = start_in_own_session(command, self.ray_env(), self._output)
        if self.on_launch is not None:
            self.on_launch(self._process.pid)

    def ray_env(self) -> dict[str, str]:
        """The environment of this cluster's Ray processes."""
        # RAY_ADDRESS for Ray's own helpers that look a cluster up with address="auto", which fails
        # ("multiple active Ray instances") when another cluster runs on this machine.
        # GLOO_SOCKET_IFNAME: gloo would otherwise pick the interface of the host name, not loopback.
        return {
            **os.environ,
            **self.env,
            "RAY_ADDRESS": self.address,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Explicit, so that a ~/.ray/auth_token left by any earlier plain ray.init() on this machine
            # (Ray 2.60 writes one and then turns token auth on for every cluster the user starts)
            # does not change how this cluster answers. It listens on loopback only.
            "RAY_AUTH_MODE": "disabled",
            "GLOO_SOCKET_IFNAME": "lo",
            # Ray nices its workers by default; on a shared machine that hands the training workers'
            # CPU to anything else running. On a cluster node the workers are what the node is for.
            "RAY_worker_niceness": "0",
        }

    def add_worker_node(self, num_cpus: int, host: str = "127.0.0.3") -> LocalRayWorkerNode:
        """Start one more node, with a loopback address of its own: a machine that can be lost and come back.

        It is stopped with the cluster, if it is still up then.
        """
        node = LocalRayWorkerNode(
            self.address, self.ray_env(), self.temp_dir, num_cpus, host, self.startup_timeout_s, self.on_launch
        )
        self._nodes.append(node)
        return node.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                code, tail = self._process.returncode, self._output.read_text(errors="replace")[-2000:]
                self.stop()
                raise _EarlyExitError(code, tail)
            if (self.temp_dir / "ray_current_cluster").exists() and _accepts(self.host, self.gcs_port):
                # The raylet registers after the GCS; a short pause avoids racing a driver against it.
                time.sleep(1.0)
                return
            time.sleep(0.2)
        self.stop()
        raise SpotrayError(
            f"the local Ray cluster did not start within {self.startup_timeout_s:.0f} s",
            "the machine may be overloaded; try again, or raise startup_timeout_s",
        )

    def standing(self) -> bool:
        """True while the head's processes run and its GCS accepts connections: a new driver can use it."""
        return self._process is not None and self._process.poll() is None and _accepts(self.host, self.gcs_port)

    def head_exit_code(self) -> int | None:
        """The exit code of the head's `ray start --block` (it ends when any head process dies); None while up."""
        return None if self._process is None else self._process.poll()

    def kill(self) -> None:
        """SIGKILL every process of the cluster at once: what losing the head node looks like."""
        for node in self._nodes:
            node.kill()
        self._signal_session(signal.SIGKILL)
        if self._process is not None:
            self._process.wait()

    def stop(self) -> None:
        """Stop the cluster: SIGTERM to every process of its session, then SIGKILL what is left."""
        for node in self._nodes:
            node.kill()  # a node holds only workers, which end with the driver: no grace needed
        self._nodes.clear()
        if self._process is None:
            return
        self._signal_session(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=STOP_GRACE_S)
        self._signal_session(signal.SIGKILL)
        self._process.wait()
        self._process = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _signal_session(self, signum: int) -> None:
        if self._process is None:
            return
        # Ray's own daemons stay in the session of `ray start`; drivers we start join it too (see launch).
        signal_session(self._process.pid, signum)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class LocalRayWorkerNode:
    """A Ray worker node joined to the cluster at ``address``: ``kill()`` is a spot machine vanishing."""

    address: str  # the head's GCS, host:port
    env: dict[str, str]  # the node's processes' environment (its workers get it, as a pod's env)
    log_dir: Path
    num_cpus: int
    host: str
    startup_timeout_s: float = 90.0
    on_launch: Callable[[int], None] | None = field(default=None, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _output: Path = field(default=Path("/dev/null"), init=False, repr=False)

    def start(self) -> LocalRayWorkerNode:
        """Start the node; a port taken between our pick and Ray's bind costs a retry with new ports."""
        for attempt in range(1, STARTUP_ATTEMPTS + 1):
            try:
                return self._start_once()
            except _EarlyExitError as exited:
                if attempt == STARTUP_ATTEMPTS:
                    raise SpotrayError(
                        f"a Ray worker node on {self.host} exited during startup (code {exited.code}), "
                        f"{attempt} times; its output ends with:\n{exited.log_tail}",
                        "a full disk or /tmp, or too little shared memory (/dev/shm), are common causes",
                    ) from None
        raise AssertionError("unreachable")

    def _start_once(self) -> LocalRayWorkerNode:
        worker_low = free_worker_port_range(self.host)
        command = [
            ray_executable(),
            "start",
            "--block",
            f"--address={self.address}",
            f"--node-ip-address={self.host}",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            "--disable-usage-stats",
            *node_port_flags(self.host, worker_low),
        ]
        self._output = self.log_dir / f"ray-node-{self.host}-{worker_low}.log"
        self._process = start_in_own_session(command, self.env, self._output)
        if self.on_launch is not None:
            self.on_launch(self._process.pid)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            output = self._output.read_text(errors="replace")
            if "Ray runtime started" in output:
                return self
            if self._process.poll() is not None:
                code = self._process.returncode
                self.kill()  # whatever it started in its session goes with it
                raise _EarlyExitError(code, output[-2000:])
            time.sleep(0.2)
        self.kill()
        raise SpotrayError(
            f"a Ray worker node on {self.host} did not start within {self.startup_timeout_s:.0f} s",
            "the machine may be overloaded; try again",
        )

    def kill(self) -> None:
        """SIGKILL the node's raylet and every worker on it at once."""
        if self._process is None:
            return
        signal_session(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._process = None

    def start_notice(self, deadline_s: int, log_path: Path) -> subprocess.Popen[bytes]:
        """A spot notice: the preStop hook a pod would run (train/launch/drain.py), against this node.

        It drains the node as a preemption and returns once the training workers on it are done (or
        their group goes on without them), or the deadline nears; then ``stop()`` is the kubelet's SIGTERM.
        """
        command = [
            sys.executable, "-m", "spotray.train.launch.drain",
            "--deadline-seconds", str(deadline_s), "--node-ip-address", self.host,
        ]  # fmt: skip
        return start_in_own_session(command, {**self.env, "RAY_ADDRESS": self.address}, log_path)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the node's processes, as the kubelet stops a pod: Ray's raylet leaves the cluster
        at once (a SIGKILLed one is marked dead only after its heartbeats are missed); SIGKILL after ``grace_s``."""
        if self._process is None:
            return
        signal_session(self._process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=grace_s)
        self.kill()  # whatever is left of its session


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
