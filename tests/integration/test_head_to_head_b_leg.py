"""The head-to-head's B leg works as Ray documents it (issue 74): bench/head_to_head/ray_documented.py on
a local Ray cluster with its storage_path on a real S3 server (SeaweedFS). Its driver killed after a
checkpoint reached storage, the same command again resumes from that checkpoint (Ray Train's run of
the same name and storage_path), as a KubeRay RayJob's backoffLimit retry would, and trains to the end.

Its ``--progress`` log (the benchmark's instrument, read by bench/head_to_head/real_pods.py) holds both
worker groups: the first from scratch, the second from the step of the checkpoint it resumed.

In make test-campaign: about two minutes (two drivers, a Ray cluster).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.head_to_head.real_pods import ray_documented_groups
from spotray.local.local_ray import LocalRayCluster
from spotray.train.storage.local_s3 import LocalS3Server
from tests.conftest import TEST_BUCKET

pytestmark = [pytest.mark.integration, pytest.mark.campaign]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "head_to_head" / "ray_documented.py"
STEPS, EVERY = 40, 10


def s3_client(s3_server: LocalS3Server) -> Any:
    import boto3  # noqa: PLC0415

    env = s3_server.env()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


def checkpoints(s3_server: LocalS3Server, prefix: str) -> set[str]:
    """Ray Train's checkpoint directories under the run's storage, by name (checkpoint_YYYY-...)."""
    listed = s3_client(s3_server).list_objects_v2(Bucket=TEST_BUCKET, Prefix=prefix).get("Contents", [])
    return {
        obj["Key"][len(prefix) :].split("/", 1)[0]
        for obj in listed
        if "/checkpoint_" in "/" + obj["Key"][len(prefix) :]
    }


@pytest.mark.timeout(900)
def test_the_ray_documented_leg_resumes_a_killed_driver_from_its_storage(
    s3_server: LocalS3Server, tmp_path: Path
) -> None:
    name = f"b-leg-{int(time.time())}"
    command = [sys.executable, str(SCRIPT), "--name", name, "--storage", f"{TEST_BUCKET}/ray-results",
               "--max-steps", str(STEPS), "--every", str(EVERY), "--min-step-seconds", "0.3", "--progress"]  # fmt: skip
    prefix = f"ray-results/{name}/"
    with LocalRayCluster(num_cpus=2) as cluster:
        env = {**cluster.ray_env(), **s3_server.env()}
        first_log = tmp_path / "first.log"
        with first_log.open("w") as log:
            first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 600
        while not checkpoints(s3_server, prefix):
            assert first.poll() is None, first_log.read_text()[-4000:]
            assert time.monotonic() < deadline, first_log.read_text()[-4000:]
            time.sleep(1)
        first.send_signal(signal.SIGKILL)  # the head's driver gone, as with its node
        first.wait(timeout=30)
        second = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False
        )
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    (tmp_path / "second.log").write_text(output)
    # What the second driver's workers reported: the steps of the checkpoints they saved. Resumed, its
    # first is past a checkpoint the first driver saved; a fresh start would report step EVERY again.
    reported = [int(step) for step in re.findall(r"'step': (\d+)\}", output)]
    assert reported, output[-4000:]
    assert reported[0] > EVERY, f"the second driver started over: it reported steps {reported}"
    assert reported[-1] == STEPS, reported
    assert "finished:" in output, output[-4000:]
    s3 = s3_client(s3_server)
    logs = s3.list_objects_v2(Bucket=TEST_BUCKET, Prefix=f"{prefix}bench-progress/").get("Contents", [])
    records = [json.loads(s3.get_object(Bucket=TEST_BUCKET, Key=o["Key"])["Body"].read()) for o in logs]
    groups = ray_documented_groups(records)
    assert len(groups) == 2, records
    assert groups[0].resumed_from is None
    resumed = groups[1].resumed_from
    assert resumed is not None, records
    assert resumed >= EVERY, records
    assert resumed % EVERY == 0, records  # a checkpoint's step
    assert groups[1].points[0][0] == groups[1].resumed_from + 1
    assert groups[1].points[-1][0] == STEPS
    assert any(point[1] is not None for point in groups[1].points), "no loss in the step log"
