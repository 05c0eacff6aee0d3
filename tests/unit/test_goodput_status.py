"""status.goodput and status.checkpointInterval as the controller reads them: every attempt's progress
object, an ended attempt read once (issue #16, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.status import CheckpointInterval
from spotray.controller.run_store import StoreReports
from spotray.train.records.progress_log import AttemptProgress
from spotray.train.storage.store import ObjectStore, open_store

pytestmark = pytest.mark.unit


class CountingStore:
    """A real store that counts the objects read (the controller's S3 cost)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.checkpoint_key = inner.checkpoint_key
        self.uri = inner.uri
        self.gets: list[str] = []

    def list(self, prefix: str = "") -> list:  # type: ignore[type-arg]
        return self.inner.list(prefix)

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        self.gets.append(key)
        return self.inner.get_bytes(key, max_bytes=max_bytes)


def write(store: ObjectStore, progress: AttemptProgress) -> None:
    store.put_bytes(progress.attempt_id.progress_key, progress.to_json())


def test_the_ledger_spans_every_attempt_and_reads_an_ended_one_once(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    # Attempt 1: asked for at t=0, workers up at 10, steps 1-30 at t=11..40, lost; checkpoint at 20.
    write(store, AttemptProgress(1, "uid", None, 60, 2, 40.0, [(s, 1.0, 10.0 + s) for s in range(1, 31)], started=10.0))
    # Attempt 2: asked for at t=100, workers up at 160, steps 21-40 at t=161..180 so far.
    second = AttemptProgress(2, "uid", 20, 60, 2, 180.0, [(s, 1.0, 140.0 + s) for s in range(21, 41)], started=160.0)
    second.checkpoint_interval = {"steps": 25, "checkpointSeconds": 0.5}
    write(store, second)
    counting = CountingStore(store)
    reports = StoreReports()
    requested = {1: 0.0, 2: 100.0}

    report = reports.read(counting, AttemptId("uid", 2), ended=False, requested=requested)  # type: ignore[arg-type]

    assert report.goodput is not None
    goodput = report.goodput.to_status()  # as status.goodput shows it
    assert goodput["wallSeconds"] == 180  # from asking for attempt 1 to attempt 2's latest step
    assert goodput["survivingStepSeconds"] == 19 + 19  # steps 2-20 of attempt 1, 22-40 of attempt 2
    assert goodput["lostSeconds"]["waitingForCapacity"] == 10 + 60
    assert goodput["lostSeconds"]["redoneSteps"] == 10  # steps 21-30 of attempt 1
    assert goodput["stepsRedone"] == [10]
    assert goodput["ratio"] == pytest.approx(38 / 180, abs=1e-3)
    assert report.checkpoint_interval == CheckpointInterval(steps=25, checkpoint_seconds=0.5)
    assert counting.gets.count(AttemptId("uid", 1).progress_key) == 1

    # Attempt 2 trains on: its object is read again, attempt 1's is not.
    second.points.append((41, 1.0, 181.0))
    write(store, second)
    report = reports.read(counting, AttemptId("uid", 2), ended=False, requested=requested)  # type: ignore[arg-type]
    assert report.goodput is not None
    assert report.goodput.surviving_step_seconds == 39
    assert counting.gets.count(AttemptId("uid", 1).progress_key) == 1
    assert counting.gets.count(AttemptId("uid", 2).progress_key) == 2


def test_no_goodput_before_the_first_step(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    write(store, AttemptProgress(1, "uid", None, 60, 2, 5.0, [], started=5.0))
    assert StoreReports().read(store, AttemptId("uid", 1), ended=False).goodput is None
