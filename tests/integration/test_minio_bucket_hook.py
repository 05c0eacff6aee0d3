"""The chart's MinIO bucket hook (templates/minio.yaml) in MinIO's mc image, run as its Job runs it
(the rendered command, /bin/sh, mc on PATH, a fresh config dir) against a real MinIO: it makes the
buckets, says so, and a second run (every upgrade) changes nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.minio import ROOT_PASSWORD, ROOT_USER, Minio, binary, minio_server
from tests.unit.test_chart import helm, only, render  # noqa: F401 - helm: the fixture, used by name below

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("helm")]


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Minio:  # type: ignore[misc]
    with minio_server(tmp_path_factory.mktemp("minio")) as server:
        yield server


def bucket_hook() -> dict[str, Any]:
    objects = render("minio.yaml", "minio.buckets={spotray,team-runs}")
    job = only(
        objects, "Job", next(o["metadata"]["name"] for o in objects if o["metadata"]["name"].endswith("-buckets"))
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def run_hook(container: dict[str, Any], minio: Minio, work: Path) -> subprocess.CompletedProcess[str]:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {"MINIO_URL": minio.url, "MINIO_ROOT_USER": ROOT_USER, "MINIO_ROOT_PASSWORD": ROOT_PASSWORD}
    env |= {"PATH": f"{binary('mc').parent}:{os.environ['PATH']}", "HOME": str(work), "MC_CONFIG_DIR": str(work / "mc")}
    return subprocess.run(container["command"], env=env, capture_output=True, text=True, check=False, timeout=120)


def test_the_hook_makes_the_buckets_in_the_mc_image_and_runs_again_unchanged(minio: Minio, tmp_path: Path) -> None:
    container = bucket_hook()
    assert container["image"].startswith("quay.io/minio/mc:"), "the small client image, not the training image"
    assert {e["name"] for e in container["env"]} >= {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}

    first = run_hook(container, minio, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines() == ["bucket spotray: ready", "bucket team-runs: ready"]
    root = minio.store("s3://team-runs/x", ROOT_USER, ROOT_PASSWORD)
    root.check()

    again = run_hook(container, minio, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == first.stdout
