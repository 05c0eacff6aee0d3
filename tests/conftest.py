"""Shared fixtures: one real SeaweedFS S3 server per test session, a fresh prefix per test."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import complete_checkpoints
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import ObjectStore, RetryPolicy, S3ObjectStore
from tests.processes import process_tree

TEST_BUCKET = "spotray-test"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    with LocalS3Server(tmp_path_factory.mktemp("seaweedfs")) as server:
        server.create_bucket(TEST_BUCKET)
        yield server


@pytest.fixture
def s3_uri(request: pytest.FixtureRequest) -> str:
    """A prefix no other test uses, so tests never see each other's objects."""
    return f"s3://{TEST_BUCKET}/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_store(s3_server: LocalS3Server, s3_uri: str) -> S3ObjectStore:
    return S3ObjectStore(parse_uri(s3_uri), s3_server.config, RetryPolicy(deadline_s=30))


@pytest.fixture
def s3_env(s3_server: LocalS3Server) -> dict[str, str]:
    """The environment a training subprocess needs to reach the test server."""
    return {**os.environ, **s3_server.env()}


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def torchrun_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a torchrun under test: this checkout importable, one thread per process, and every
    thread's stack printed when ``wait_or_dump_stacks`` aborts a hung run."""
    return {
        **env,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
    }


def start_in_own_group(command: list[str], **popen: Any) -> subprocess.Popen[str]:
    """``command`` as the leader of a new process group, so that a hang can be aborted with its children."""
    return subprocess.Popen(command, start_new_session=True, text=True, **popen)


def wait_or_dump_stacks(process: subprocess.Popen[str], timeout_s: float) -> int:
    """The exit code of ``process``; if it runs past ``timeout_s``, SIGABRT it and every descendant first.

    With PYTHONFAULTHANDLER set (``torchrun_env``) every Python process of the tree then prints all
    its threads' stacks to stderr: a hang in CI names the line it hung on instead of only a timeout.
    """
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own: signal every descendant by pid.
        for pid in process_tree(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        os.killpg(process.pid, signal.SIGABRT)
        try:
            process.wait(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return -signal.SIGABRT


def run_ranks(script: Path, args: list[str], env: dict[str, str], timeout_s: float = 300, processes: int = 2) -> None:
    """``script`` under torchrun as ``processes`` CPU processes (gloo) with this checkout importable; fails
    with their output."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), str(script)
    ]  # fmt: skip
    with tempfile.TemporaryFile("w+") as output:
        process = start_in_own_group([*command, *args], env=torchrun_env(env), stdout=output, stderr=subprocess.STDOUT)
        code = wait_or_dump_stacks(process, timeout_s)
        output.seek(0)
        assert code == 0, (
            f"torchrun exited with {code} (a negative code: that signal; SIGABRT: hung, stacks below)\n"
            + output.read()[-12000:]
        )


def saved_steps_and_uploads_checked(events_path: Path, store: ObjectStore) -> list[int]:
    """The steps saved (checkpoint_saved events), after checking that the store holds each of them as a
    complete checkpoint unless a newer one made the uploader drop it (checkpoint_dropped: uploads falling
    behind on a loaded machine, by design) and that the last one saved is always there."""
    logged = list(read_events(events_path))
    saved = [e["step"] for e in logged if e["event"] == "checkpoint_saved"]
    dropped = {step for e in logged if e["event"] == "checkpoint_dropped" for step in e["steps"]}
    assert saved, "no checkpoint_saved event"
    assert saved[-1] not in dropped
    assert sorted(info.step for info in complete_checkpoints(store)) == [s for s in sorted(saved) if s not in dropped]
    return saved


@pytest.fixture
def silent_peer() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(connection)  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()
