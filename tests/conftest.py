"""Shared fixtures: one real SeaweedFS S3 server per test session, a fresh prefix per test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotray.train.checkpoint import complete_checkpoints
from spotray.train.events import read_events
from spotray.train.local_s3 import LocalS3Server
from spotray.train.store import ObjectStore, RetryPolicy, S3ObjectStore, parse_uri

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


def run_two_ranks(script: Path, args: list[str], env: dict[str, str]) -> None:
    """``script`` under torchrun as 2 CPU processes (gloo) with this checkout importable; fails with their output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    env = {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


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
