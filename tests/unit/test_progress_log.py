"""train/records/progress_log.py: each attempt's progress object, written and read back through a store."""

import json
import threading
import time
from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.bounded_json import bounds_problem
from spotray.train.records.progress_log import (
    MAX_POINTS,
    MAX_PROGRESS_BYTES,
    MAX_PROGRESS_VALUES,
    MAX_RESTARTS,
    MAX_WORKER_HOSTS,
    AttemptProgress,
    ProgressWriter,
    WorkerHosts,
    continue_attempt_progress,
    read_attempt_progress,
    read_run_progress,
)
from spotray.train.storage.store import ObjectStore, open_store

pytestmark = [pytest.mark.unit, pytest.mark.core]


def test_progress_is_written_off_the_training_thread_and_read_back_per_attempt(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    first = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1", max_steps=100, world_size=2), interval_s=3600)
    first.record(1, 5.0)  # the first point is written at once (nothing written yet)
    first.record(2, 4.0)  # within the interval: kept in memory until a flush
    assert first.flush(timeout_s=10)
    second = ProgressWriter(store, AttemptProgress(attempt=2, run_id="r1", resumed_from=2, max_steps=100), interval_s=0)
    second.record(3, 3.5)
    assert second.close(timeout_s=10)

    history = read_run_progress(store)

    assert [p.attempt for p in history] == [1, 2]
    assert [step for step, _, _ in history[0].points] == [1, 2]
    assert history[1].resumed_from == 2
    assert (history[1].last_step, history[1].last_loss) == (3, 3.5)
    assert read_attempt_progress(store, AttemptId("r1", 3)) is None
    assert read_attempt_progress(store, AttemptId("another-run", 1)) is None


class StalledStore:
    """A store whose writes hang until released: an S3 outage as the training thread would meet it."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.checkpoint_key = inner.checkpoint_key
        self.release = threading.Event()
        self.writes = 0

    def put_bytes(self, key: str, data: bytes) -> None:
        self.release.wait(timeout=30)
        self.writes += 1
        self.inner.put_bytes(key, data)


def test_a_stalled_store_never_blocks_a_step_and_writes_coalesce(tmp_path: Path) -> None:
    store = StalledStore(open_store(str(tmp_path / "ckpt")))
    writer = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1"), interval_s=0)  # type: ignore[arg-type]
    started = time.monotonic()
    for step in range(1, 2001):
        writer.record(step, 1.0)
    assert time.monotonic() - started < 2.0  # 2,000 steps recorded while the store hangs
    assert not writer.flush(timeout_s=0.2)  # says so when it cannot land in time
    store.release.set()
    assert writer.close(timeout_s=10)
    assert store.writes <= 3  # the hung first write, then one or two snapshots with every point
    assert read_attempt_progress(store.inner, AttemptId("r1", 1)).last_step == 2000


def test_the_progress_object_stays_bounded_and_keeps_the_whole_curve() -> None:
    progress = AttemptProgress(attempt=1, run_id="r1")
    for step in range(1, 50_001):
        progress.points.append((step, 1.0, float(step)))
        progress.thin(max_points=1000)
    assert len(progress.points) <= 1000
    assert progress.points[0][0] == 1
    assert progress.points[-1][0] == 50_000
    assert len(progress.to_json()) < 64_000


def test_speed_needs_two_points() -> None:
    progress = AttemptProgress(attempt=1, run_id="r1", points=[(10, 1.0, 100.0)])
    assert progress.steps_per_second() is None
    progress.points.append((30, 0.9, 110.0))
    assert progress.steps_per_second() == pytest.approx(2.0)


def test_an_unreadable_or_foreign_progress_object_is_ignored(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    attempt = AttemptId("r1", 1)
    store.put_bytes(attempt.progress_key, b"{not json")
    assert read_attempt_progress(store, attempt) is None
    assert read_run_progress(store) == []
    # An older run's object copied under this run's key: its identity says whose it is.
    store.put_bytes(attempt.progress_key, AttemptProgress(attempt=1, run_id="old", points=[(5, 1.0, 1.0)]).to_json())
    assert read_attempt_progress(store, attempt) is None


def test_a_restarted_worker_group_continues_its_attempts_object(tmp_path: Path) -> None:
    """Ray Train restarted the workers inside attempt 1: the first group's points stay, the restart is marked."""
    store = open_store(str(tmp_path / "ckpt"))
    first = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1", world_size=2, started=100.0), interval_s=0)
    for step in (1, 2, 3):
        first.record(step, 5.0 - step)
    first.record_checkpoint_stall(2, 0.25)
    assert first.close(timeout_s=10)

    fresh = AttemptProgress(attempt=1, run_id="r1", resumed_from=2, world_size=1, started=200.0)
    continued = continue_attempt_progress(store, fresh)
    assert [step for step, _, _ in continued.points] == [1, 2, 3]
    assert [step for step, _ in continued.restarts] == [2]
    assert (continued.started, continued.world_size, continued.checkpoint_stalls[0][:2]) == (100.0, 1, (2, 0.25))
    # A new attempt (another number) starts its own object.
    assert continue_attempt_progress(store, AttemptProgress(attempt=2, run_id="r1")).points == []


def test_the_new_fields_survive_a_round_trip_and_old_objects_still_read() -> None:
    progress = AttemptProgress(
        attempt=3,
        run_id="r1",
        points=[(5, 1.0, 10.0)],
        started=9.0,
        restarts=[(4, 9.5)],
        checkpoint_stalls=[(5, 0.5, 10.1)],
        checkpoint_interval={"steps": 40},
    )
    assert AttemptProgress.from_json(progress.to_json()) == progress
    old = b'{"run_id": "r1", "attempt": 1, "points": [[1, 2.0, 3.0]]}'  # written before these fields existed
    assert AttemptProgress.from_json(old).restarts == []


def test_checkpoint_stalls_stay_bounded_and_keep_their_sum() -> None:
    progress = AttemptProgress(attempt=1, run_id="r1", checkpoint_stalls=[(s, 1.0, float(s)) for s in range(100)])
    progress.thin(max_points=50)
    assert len(progress.checkpoint_stalls) == 75
    assert sum(seconds for _, seconds, _ in progress.checkpoint_stalls) == pytest.approx(100.0)


def test_the_largest_object_the_writer_keeps_is_one_its_readers_parse() -> None:
    """What thinning leaves at most, with the longest numbers of each field: within the bounds the
    controller keeps against hostile objects, so a long run's progress is never refused as one."""
    step, loss, at = 2**63 - 1, -2.2250738585072014e-308, 1763869990.5123456
    decision_keys = ("steps", "targetSeconds", "checkpointSeconds", "stepSeconds", "interruptions", "minSteps")
    largest = AttemptProgress(
        attempt=2**31,
        run_id="r" * 64,
        resumed_from=step,
        max_steps=step,
        world_size=2**31,
        started=at,
        updated=at,
        points=[(step, loss, at)] * MAX_POINTS,
        checkpoint_stalls=[(step, 86400.1234, at)] * MAX_POINTS,
        restarts=[(step, at)] * MAX_RESTARTS,
        checkpoint_interval=dict.fromkeys(decision_keys, 1.7976931348623157e308),
        worker_hosts=WorkerHosts(("p" * 253,) * MAX_WORKER_HOSTS, ("p" * 253,) * MAX_WORKER_HOSTS, at),
    )
    largest.thin()  # the writer thins after every change: at these counts it drops nothing
    written = largest.to_json()
    assert bounds_problem(written, max_bytes=MAX_PROGRESS_BYTES, max_values=MAX_PROGRESS_VALUES) is None
    assert len(written) < 0.9 * MAX_PROGRESS_BYTES
    assert AttemptProgress.from_json(written) == largest


def test_restarts_stay_bounded_also_when_a_worker_group_continues_the_object(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    restarts = [(step, float(step)) for step in range(MAX_RESTARTS)]
    many = AttemptProgress(attempt=1, run_id="r1", points=[(1, 1.0, 1.0)], restarts=restarts)
    store.put_bytes(many.attempt_id.progress_key, many.to_json())
    continued = continue_attempt_progress(store, AttemptProgress(attempt=1, run_id="r1", resumed_from=MAX_RESTARTS))
    assert len(continued.restarts) <= MAX_RESTARTS
    assert continued.restarts[0][0] == 0
    assert continued.restarts[-1][0] == MAX_RESTARTS  # the newest restart is kept


def test_worker_hosts_round_trip_and_a_malformed_one_is_dropped_not_the_progress(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    writer = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1"), interval_s=3600)
    writer.record_worker_hosts(WorkerHosts(idle=("w-b",), busy=("w-a",), time=1.5))
    assert writer.close()
    read = read_attempt_progress(store, AttemptId("r1", 1))
    assert read is not None
    assert read.worker_hosts == WorkerHosts(idle=("w-b",), busy=("w-a",), time=1.5)

    many = {"idle": ["w"] * (MAX_WORKER_HOSTS + 1), "busy": [], "time": 1.0}
    assert WorkerHosts.from_json(many) == WorkerHosts(("w",) * MAX_WORKER_HOSTS, (), 1.0), "cut, not dropped"
    not_a_time = ("x", True, None, float("nan"), float("inf"))
    malformed = [{"idle": [], "busy": [], "time": at} for at in not_a_time]
    malformed += [{"idle": "w-b", "busy": [], "time": 1.0}, {"idle": [1], "busy": [], "time": 1.0}, {"idle": []}, [1]]
    for bad in malformed:
        raw = json.loads(read.to_json())
        raw["worker_hosts"] = bad
        parsed = AttemptProgress.from_json(json.dumps(raw).encode())
        assert parsed.worker_hosts is None
        assert parsed.attempt == 1
