"""Real Ray Train runs on a local Ray cluster with a real S3 server: head loss, resume with fewer workers.

The driver (``python -m jobs.gpt2``) is killed with SIGKILL, which takes Ray Train's controller and
every worker with it (they are owned by the driver): what losing the head node does to a RayJob.
Starting the job again resumes from the latest complete checkpoint, this time with one worker
instead of two, and every sample of the epoch is trained exactly once.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotray.local_ray import LocalRayCluster
from train.checkpoint import preemption_marker_key
from train.data import NUM_CANONICAL_NODES
from train.events import read_events
from train.launcher import EXIT_PREEMPTED, EXIT_SUCCEEDED, outcome_after_fit
from train.local_s3 import LocalS3Server
from train.store import S3ObjectStore, parse_uri

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_STEPS = 40
SAVE_STEPS = 10
GLOBAL_BATCH = 8
SEED = 42


@pytest.fixture(scope="module")
def ray_cluster(s3_server: LocalS3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    log = tmp_path_factory.mktemp("ray") / "ray.log"
    with LocalRayCluster(num_cpus=2, log_path=log, env=s3_server.env()) as cluster:
        yield cluster


def job_command(checkpoint_uri: str, data_uri: str, workdir: Path, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "jobs.gpt2",
        "--checkpoint-uri", checkpoint_uri,
        "--data-uri", data_uri,
        "--workers", str(workers),
        "--workdir", str(workdir),
        "--max-steps", str(MAX_STEPS),
        "--save-steps", str(SAVE_STEPS),
        "--batch-size", str(GLOBAL_BATCH),
        "--seed", str(SEED),
        "--events", str(workdir / "events.jsonl"),
    ]  # fmt: skip


def start_job(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(events: Path, done: Callable[[list[dict]], bool], child: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        if done(list(read_events(events))):
            return
        if child.poll() is not None:
            pytest.fail(f"the job exited with {child.returncode}; log:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out; log:\n{log.read_text()[-4000:]}")


def trained_ids(sample_log: Path, resumed_at: int) -> list[int]:
    """Sample ids trained in steps that count: the first attempt's up to the resume step, then the second's."""
    ids: list[int] = []
    for path in sorted(sample_log.glob("*.jsonl")):
        start = int(path.name.split("-start-")[1].split("-")[0])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if (start == 0 and record["step"] <= resumed_at) or (start == resumed_at and record["step"] > resumed_at):
                ids.extend(record["ids"])
    return ids


def first_samples_of_epoch(data_uri: str, cache: Path, count: int, env: dict[str, str]) -> set[int]:
    """The oracle: the first ``count`` samples of epoch 0 in streaming's global order, read by one process."""
    script = f"""
import json, sys
from streaming import StreamingDataset
dataset = StreamingDataset(remote={data_uri!r}, local={str(cache)!r}, batch_size={GLOBAL_BATCH}, shuffle=True,
                           shuffle_seed={SEED}, num_canonical_nodes={NUM_CANONICAL_NODES})
ids = []
for sample in dataset:
    ids.append(int(sample["sample_id"]))
    if len(ids) == {count}:
        break
print(json.dumps(ids))
"""
    clean_env = {key: value for key, value in env.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    result = subprocess.run(
        [sys.executable, "-c", script], env=clean_env, capture_output=True, text=True, timeout=300, check=True
    )
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_head_lost_then_resumed_with_fewer_workers_trains_every_sample_once(
    ray_cluster: LocalRayCluster, s3_server: LocalS3Server, s3_uri: str, tmp_path: Path
) -> None:
    checkpoint_uri, data_uri = f"{s3_uri}/run", f"{s3_uri}/data"
    sample_log = tmp_path / "samples"
    env = {
        **os.environ,
        **s3_server.env(),
        "RAY_ADDRESS": ray_cluster.address,
        "SPOTRAY_SAMPLE_LOG": str(sample_log),
        "PYTHONUNBUFFERED": "1",
    }
    events, log = tmp_path / "events.jsonl", tmp_path / "job.log"

    # 1) two workers; killed like a lost head once checkpoint-20 is complete and a few steps are past it.
    first = start_job(job_command(checkpoint_uri, data_uri, tmp_path, workers=2), env, log)

    def past_second_checkpoint(logged: list[dict]) -> bool:
        complete = [e["step"] for e in logged if e["event"] == "checkpoint_complete"]
        steps = [e["step"] for e in logged if e["event"] == "step"]
        return 2 * SAVE_STEPS in complete and bool(steps) and steps[-1] >= 2 * SAVE_STEPS + 3

    wait_for(events, past_second_checkpoint, first, log)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = max(e["step"] for e in read_events(events) if e["event"] == "step")

    # 2) the same command with one worker: resumes from the newest complete checkpoint and finishes.
    second = subprocess.run(
        job_command(checkpoint_uri, data_uri, tmp_path, workers=1),
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    starts = [e for e in read_events(events) if e["event"] == "start"]
    assert [s["world_size"] for s in starts] == [2, 1]
    resumed_at = starts[1]["resumed_from"]
    assert 2 * SAVE_STEPS <= resumed_at <= killed_at
    assert killed_at - resumed_at < SAVE_STEPS, "lost more than one checkpoint interval"
    assert starts[1]["data_position"] == {"epoch": 0, "sample_in_epoch": resumed_at * GLOBAL_BATCH}
    ends = [e for e in read_events(events) if e["event"] == "end"]
    assert ends
    assert ends[-1]["step"] == MAX_STEPS

    ids = trained_ids(sample_log, resumed_at)
    assert len(ids) == MAX_STEPS * GLOBAL_BATCH
    duplicates = len(ids) - len(set(ids))
    assert duplicates == 0, f"{duplicates} samples trained twice"
    expected = first_samples_of_epoch(
        str(parse_uri(data_uri)), tmp_path / "oracle-cache", MAX_STEPS * GLOBAL_BATCH, env
    )
    assert set(ids) == expected, f"{len(expected - set(ids))} samples skipped"


def test_attempt_outcome_comes_from_the_preemption_marker(s3_store: S3ObjectStore) -> None:
    assert outcome_after_fit(s3_store, attempt=3).exit_code == EXIT_SUCCEEDED
    s3_store.put_bytes(preemption_marker_key(3), json.dumps({"step": 47}).encode())
    outcome = outcome_after_fit(s3_store, attempt=3)
    assert outcome.exit_code == EXIT_PREEMPTED
    assert outcome.step == 47
    assert outcome_after_fit(s3_store, attempt=4).exit_code == EXIT_SUCCEEDED
