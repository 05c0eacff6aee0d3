"""Real Ray Train runs on a local Ray cluster with a real S3 server: head loss, resume with fewer workers.

The driver (``python -m spotray.jobs.gpt2``) is killed with SIGKILL, which takes Ray Train's controller and
every worker with it (they are owned by the driver): what losing the head node does to a RayJob.
Starting the job again resumes from the latest complete checkpoint, this time with one worker
instead of two. Compared with an uninterrupted two-worker run of the same job: the same samples,
each trained exactly once, and the same final loss and weights (dropout is off so that one and two
workers compute the same thing up to float rounding).
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotray.contract.attempts import EXIT_OK, EXIT_PREEMPTED, AttemptId
from spotray.contract.uris import parse_uri
from spotray.local.local_ray import LocalRayCluster
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.launch.launcher import outcome_after_fit
from spotray.train.records.attempt_records import write_preemption
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore
from tests.conftest import TEST_BUCKET

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
        sys.executable, "-m", "spotray.jobs.gpt2",
        "--checkpoint-uri", checkpoint_uri,
        "--data-uri", data_uri,
        "--workers", str(workers),
        "--workdir", str(workdir),
        "--max-steps", str(MAX_STEPS),
        "--save-steps", str(SAVE_STEPS),
        "--batch-size", str(GLOBAL_BATCH),
        "--seed", str(SEED),
        "--dropout", "0",
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


def sample_records(sample_log: Path) -> list[tuple[int, int, list[int]]]:
    """(start step, step, ids) for every batch any rank trained, across attempts."""
    records = []
    for path in sorted(sample_log.glob("*.jsonl")):
        start = int(path.name.split("-start-")[1].split("-")[0])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records.append((start, record["step"], record["ids"]))
    return records


def trained_ids(sample_log: Path, resumed_at: int) -> list[int]:
    """Sample ids trained in steps that count: the first attempt's up to the resume step, then the second's."""
    return [
        sample_id
        for start, step, ids in sample_records(sample_log)
        if (start == 0 and step <= resumed_at) or (start == resumed_at and step > resumed_at)
        for sample_id in ids
    ]


def final_weights(store: S3ObjectStore, dest: Path) -> dict[str, torch.Tensor]:
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == MAX_STEPS
    store.download_files([(f"{latest.prefix}/model.safetensors", dest)])
    return load_file(dest)


def final_loss(events: Path) -> float:
    return [e["loss"] for e in read_events(events) if e["event"] == "step" and e["step"] == MAX_STEPS][-1]


@dataclass(frozen=True)
class FinishedRun:
    store: S3ObjectStore
    data_uri: str
    workdir: Path

    @property
    def events(self) -> Path:
        return self.workdir / "events.jsonl"

    @property
    def sample_log(self) -> Path:
        return self.workdir / "samples"


def job_env(s3_server: LocalS3Server, ray_cluster: LocalRayCluster, workdir: Path) -> dict[str, str]:
    return {
        **os.environ,
        **s3_server.env(),
        "RAY_ADDRESS": ray_cluster.address,
        "SPOTRAY_SAMPLE_LOG": str(workdir / "samples"),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="module")
def uninterrupted(
    ray_cluster: LocalRayCluster, s3_server: LocalS3Server, tmp_path_factory: pytest.TempPathFactory
) -> FinishedRun:
    """The baseline: two workers, start to finish, no fault. It also writes the dataset the other runs read."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    uri = f"s3://{TEST_BUCKET}/ray-baseline-{uuid.uuid4().hex[:8]}"
    data_uri = f"s3://{TEST_BUCKET}/ray-data-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        job_command(f"{uri}/run", data_uri, workdir, workers=2),
        env=job_env(s3_server, ray_cluster, workdir),
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return FinishedRun(S3ObjectStore(parse_uri(f"{uri}/run"), s3_server.config), data_uri, workdir)


# About 3 minutes with its baseline run: a campaign (make test-campaign), to keep make test within 30
# minutes. A lost head with the same worker count is checked sample-exact by the chaos full runs (make
# chaos); this one adds the resume with fewer workers.
@pytest.mark.campaign
def test_head_lost_then_resumed_with_fewer_workers_matches_an_uninterrupted_run(
    ray_cluster: LocalRayCluster, s3_server: LocalS3Server, uninterrupted: FinishedRun, s3_uri: str, tmp_path: Path
) -> None:
    checkpoint_uri = f"{s3_uri}/run"
    env = job_env(s3_server, ray_cluster, tmp_path)
    events, log = tmp_path / "events.jsonl", tmp_path / "job.log"

    # 1) two workers; killed like a lost head once checkpoint-20 is complete and a few steps are past it.
    first = start_job(job_command(checkpoint_uri, uninterrupted.data_uri, tmp_path, workers=2), env, log)

    def past_second_checkpoint(logged: list[dict]) -> bool:
        complete = [e["step"] for e in logged if e["event"] == "checkpoint_complete"]
        steps = [e["step"] for e in logged if e["event"] == "step"]
        return 2 * SAVE_STEPS in complete and bool(steps) and steps[-1] >= 2 * SAVE_STEPS + 3

    wait_for(events, past_second_checkpoint, first, log)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = max(e["step"] for e in read_events(events) if e["event"] == "step")
    # The newest checkpoint complete in S3 when the head was lost: the one the next attempt must resume
    # from. (Not "less than one interval lost": a checkpoint saved just before the kill may still be
    # uploading, and then two intervals are lost; issue #15's goal is complete before the next save.)
    complete_at_kill = max(e["step"] for e in read_events(events) if e["event"] == "checkpoint_complete")

    # 2) the same command with one worker: resumes from the newest complete checkpoint and finishes.
    second = subprocess.run(
        job_command(checkpoint_uri, uninterrupted.data_uri, tmp_path, workers=1),
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
    # (the next one may have become complete in S3 just before its event could be written)
    assert resumed_at in (complete_at_kill, complete_at_kill + SAVE_STEPS), "not the newest complete checkpoint"
    assert killed_at - resumed_at < 2 * SAVE_STEPS, "lost more than the interval being uploaded and the next"
    assert starts[1]["data_position"] == {"epoch": 0, "sample_in_epoch": resumed_at * GLOBAL_BATCH}

    # every sample the uninterrupted run trained, each exactly once: no duplicates, no gaps
    ids = trained_ids(tmp_path / "samples", resumed_at)
    assert len(ids) == MAX_STEPS * GLOBAL_BATCH
    assert len(ids) - len(set(ids)) == 0, "samples trained twice"
    expected = {i for _, _, batch in sample_records(uninterrupted.sample_log) for i in batch}
    assert len(expected) == MAX_STEPS * GLOBAL_BATCH
    assert set(ids) == expected, f"{len(expected - set(ids))} samples skipped"

    # the same model: float rounding apart (one worker sums gradients in another order than two)
    assert final_loss(events) == pytest.approx(final_loss(uninterrupted.events), abs=2e-3)
    store = S3ObjectStore(parse_uri(checkpoint_uri), s3_server.config)
    resumed = final_weights(store, tmp_path / "resumed.safetensors")
    baseline = final_weights(uninterrupted.store, tmp_path / "baseline.safetensors")
    assert resumed.keys() == baseline.keys()
    worst = max(float((resumed[name] - baseline[name]).abs().max()) for name in baseline)
    assert worst < 1e-3, f"weights differ by up to {worst}"


def test_attempt_outcome_comes_from_this_attempts_preemption_record(s3_store: S3ObjectStore) -> None:
    third = AttemptId("run-a", 3)
    assert outcome_after_fit(s3_store, third).exit_code == EXIT_OK
    write_preemption(s3_store, third, 47, 2.0)
    outcome = outcome_after_fit(s3_store, third)
    assert outcome.exit_code == EXIT_PREEMPTED
    assert outcome.step == 47
    assert outcome_after_fit(s3_store, AttemptId("run-a", 4)).exit_code == EXIT_OK
    # The same attempt number of another run (re-created with the same URI) finished normally.
    assert outcome_after_fit(s3_store, AttemptId("run-b", 3)).exit_code == EXIT_OK
