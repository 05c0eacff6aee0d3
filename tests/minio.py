"""A real MinIO server and its client mc on loopback, for the chart's tenants hook.

Both are built from the Go module proxy into the test bed cache (testbed/build.sh, `make
testbed`); a missing binary fails the test with the command that builds it, never skips it.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import testbed.cluster as tb
from spotray.contract.uris import parse_uri
from spotray.train.processes.subprocesses import start_in_own_session
from spotray.train.storage.local_s3 import free_ports
from spotray.train.storage.store import S3ObjectStore, StoreConfig

ROOT = Path(__file__).resolve().parents[1]
TENANTS_SCRIPT = ROOT / "charts" / "spotray" / "files" / "minio-tenants.sh"
ROOT_USER = "spotray-root"
ROOT_PASSWORD = "spotray-root-password"


def binary(name: str) -> Path:
    try:
        return tb.binary(name)
    except FileNotFoundError as error:
        pytest.fail(f"{error}. Build it with `make testbed` (MinIO and mc: about 3 minutes cold, cached after).")


@dataclass(frozen=True)
class Minio:
    url: str
    data_dir: Path

    def store(self, uri: str, access_key: str, secret_key: str) -> S3ObjectStore:
        """spotray's own store on this server, as the user ``access_key``."""
        config = StoreConfig(endpoint_url=self.url, access_key_id=access_key, secret_access_key=secret_key)
        return S3ObjectStore(parse_uri(uri), config)


@contextmanager
def minio_server(data_dir: Path, startup_timeout_s: float = 60) -> Iterator[Minio]:
    port, console = free_ports(2)
    env = {
        **os.environ,
        "MINIO_ROOT_USER": ROOT_USER,
        "MINIO_ROOT_PASSWORD": ROOT_PASSWORD,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        str(binary("minio")),
        "server",
        str(data_dir / "data"),
        "--address",
        f"127.0.0.1:{port}",
        "--console-address",
        f"127.0.0.1:{console}",
        "--quiet",
    ]
    process = start_in_own_session(command, env, data_dir / "minio.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            assert process.poll() is None, (data_dir / "minio.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/minio/health/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"MinIO not ready in {startup_timeout_s} s"
            time.sleep(0.3)
        yield Minio(url, data_dir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_tenants_script(
    work: Path,
    pairs: Sequence[str],
    keys: Mapping[str, str],
    env: Mapping[str, str],
    script: Path = TENANTS_SCRIPT,
) -> subprocess.CompletedProcess[str]:
    """The hook's script as its Job runs it: /bin/sh, mc on PATH, one key file per user, a fresh
    config dir (the Job's emptyDir)."""
    keys_dir = work / "tenant-keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    for old in keys_dir.iterdir():
        old.unlink()
    for user, key in keys.items():
        (keys_dir / user).write_text(key)
    config_dir = work / "mc"
    config_dir.mkdir(exist_ok=True)
    path = f"{binary('mc').parent}:{os.environ['PATH']}"
    full_env = {"PATH": path, "HOME": str(work), "TENANT_KEYS_DIR": str(keys_dir), "MC_CONFIG_DIR": str(config_dir)}
    full_env.update(env)
    return subprocess.run(
        ["/bin/sh", str(script), *pairs], env=full_env, capture_output=True, text=True, check=False, timeout=120
    )
