"""An elastic run on a real two-node Ray cluster: a node is lost, the run goes on smaller, the node returns.

The Ray cluster has two nodes of one CPU each on loopback addresses of their own (a head and a worker
node), and the job asks for two workers with ``--min-workers 1``. Killing the worker node (SIGKILL of
its raylet and every process on it) is a spot machine vanishing: Ray Train restarts the worker group
with the one worker that fits, which resumes from the latest checkpoint and takes each step's global
batch in two passes. Starting the node again is capacity returning: within the resize check, Ray
Train restarts the group with two workers, again from the latest checkpoint.

Every step that counts (the newest worker group's, train/data.py ``trained_batches``) trains the
whole global batch; no sample is trained twice; and each restart continues the data position at
exactly its checkpoint's step times the global batch: none skipped, across three worker counts.
(That one and two workers train the very same samples in the same steps is the fewer-workers
test's in test_ray_training.py, against an uninterrupted run.)
"""

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotray.local_ray import LocalRayCluster
from spotray.train.data import trained_batches
from spotray.train.events import read_events
from spotray.train.local_s3 import LocalS3Server
from tests.conftest import TEST_BUCKET

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Within the first epoch (3642 samples = 455 steps), and long enough for the one-worker phase to
# outlast Ray's look for room to grow (its coordinator refreshes resources every 20 s).
MAX_STEPS = 450
SAVE_STEPS = 10
GLOBAL_BATCH = 8


@pytest.fixture
def ray_cluster(s3_server: LocalS3Server, tmp_path: Path) -> Iterator[LocalRayCluster]:
    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log", env=s3_server.env()) as cluster:
        yield cluster


def wait_for(
    events: Path, done: Callable[[list[dict]], bool], job: subprocess.Popen[bytes], log: Path, what: str
) -> list[dict]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logged = list(read_events(events))
        if done(logged):
            return logged
        if job.poll() is not None:
            pytest.fail(f"the job exited with {job.returncode} before {what}; log:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    job.kill()
    pytest.fail(f"timed out waiting for {what}; log:\n{log.read_text()[-4000:]}")


def starts(logged: list[dict]) -> list[dict]:
    return [e for e in logged if e["event"] == "start"]


def steps_after(logged: list[dict], start_index: int) -> list[int]:
    """Steps logged since the ``start_index``-th start event."""
    seen = 0
    found = []
    for event in logged:
        if event["event"] == "start":
            seen += 1
        elif event["event"] == "step" and seen == start_index + 1:
            found.append(event["step"])
    return found


def test_a_lost_node_shrinks_the_run_and_a_returning_one_grows_it_with_every_sample_once(
    ray_cluster: LocalRayCluster, s3_server: LocalS3Server, tmp_path: Path
) -> None:
    worker_node = ray_cluster.add_worker_node(num_cpus=1)
    events, log = tmp_path / "events.jsonl", tmp_path / "job.log"
    command = [
        sys.executable, "-m", "spotray.jobs.gpt2",
        "--checkpoint-uri", f"s3://{TEST_BUCKET}/elastic-{uuid.uuid4().hex[:8]}/run",
        "--data-uri", f"s3://{TEST_BUCKET}/elastic-data-{uuid.uuid4().hex[:8]}",
        "--workers", "2", "--min-workers", "1",
        "--workdir", str(tmp_path),
        "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS),
        "--batch-size", str(GLOBAL_BATCH),
        "--events", str(events),
    ]  # fmt: skip
    env = {
        **os.environ,
        **s3_server.env(),
        "RAY_ADDRESS": ray_cluster.address,
        "SPOTRAY_SAMPLE_LOG": str(tmp_path / "samples"),
        "SPOTRAY_ELASTIC_RESIZE_CHECK_S": "5",
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("ab") as output:
        job = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # 1) two workers, past a complete checkpoint: then the worker node vanishes
        wait_for(
            events,
            lambda logged: any(e["event"] == "checkpoint_complete" for e in logged) and len(steps_after(logged, 0)) > 3,
            job,
            log,
            "two workers training past a checkpoint",
        )
        worker_node.kill()
        # 2) the run goes on with one worker, two passes a step
        shrunk = wait_for(
            events,
            lambda logged: len(starts(logged)) >= 2 and len(steps_after(logged, len(starts(logged)) - 1)) > 3,
            job,
            log,
            "the run to go on with one worker",
        )
        # 3) capacity returns: the run grows back to two workers
        ray_cluster.add_worker_node(num_cpus=1)
        grown = wait_for(
            events,
            lambda logged: len(starts(logged)) > len(starts(shrunk)) and starts(logged)[-1]["world_size"] == 2,
            job,
            log,
            "the run to grow back to two workers",
        )
        assert job.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if job.poll() is None:
            job.kill()

    logged = list(read_events(events))
    sizes = [(s["world_size"], s["per_device_batch"], s["accumulation"]) for s in starts(logged)]
    assert sizes[0] == (2, 4, 1)
    assert (1, 4, 2) in sizes[1 : len(starts(shrunk))], f"no one-worker group with two passes a step: {sizes}"
    assert sizes[len(starts(grown)) - 1] == (2, 4, 1)
    assert starts(grown)[-1]["resumed_from"] < MAX_STEPS, "grew back only after the last step: nothing tested"
    resumed = [s["resumed_from"] for s in starts(logged)[1:]]
    assert all(step is not None and step % SAVE_STEPS == 0 for step in resumed), resumed
    for start in starts(logged)[1:]:
        assert start["data_position"] == {"epoch": 0, "sample_in_epoch": start["resumed_from"] * GLOBAL_BATCH}

    batches = trained_batches(tmp_path / "samples")
    assert sorted(batches) == list(range(1, MAX_STEPS + 1))
    assert all(len(ids) == GLOBAL_BATCH for ids in batches.values()), "a step without its whole global batch"
    every_id = [i for ids in batches.values() for i in ids]
    assert len(set(every_id)) == len(every_id) == MAX_STEPS * GLOBAL_BATCH, "a sample trained twice"
