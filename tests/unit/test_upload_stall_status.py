"""Uploads stalled on a store fault, seen on a cluster (issue #72, item 7): the job's rank 0 writes the
stall in its attempt's progress object (the store's answer, since when), the controller puts it in
status.progress, and `spotray status` says "uploads stalled since ...: the store answers ..." while it
lasts. Local mode's progress line already says it (tests/unit/test_local_progress.py); this is the
cluster's path through the same facts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotray.cli.run_status import describe_run
from spotray.contract.attempts import AttemptId
from spotray.controller.run_store import progress_status
from spotray.train.records.progress_log import (
    MAX_STALL_FAULT_CHARS,
    AttemptProgress,
    ProgressWriter,
    UploadStallNote,
    read_attempt_progress,
)
from spotray.train.storage.store import open_store

pytestmark = pytest.mark.unit

SINCE = 1_795_773_178.0  # 2026-11-27T09:52:58Z
STALL = UploadStallNote(since=SINCE, fault="503 SlowDown (Please reduce your request rate.)")


def logged(**fields: Any) -> AttemptProgress:
    return AttemptProgress(
        attempt=2, run_id="r", max_steps=100, updated=SINCE + 60, points=[(40, 2.5, SINCE)], **fields
    )


def test_the_stall_round_trips_through_the_progress_object_and_its_end_clears_it(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    writer = ProgressWriter(store, AttemptProgress(attempt=1, run_id="r1"), interval_s=3600)
    writer.record_upload_stall(STALL)
    assert writer.flush()
    read = read_attempt_progress(store, AttemptId("r1", 1))
    assert read is not None
    assert read.upload_stall == STALL
    writer.record_upload_stall(None)
    assert writer.close()
    read = read_attempt_progress(store, AttemptId("r1", 1))
    assert read is not None
    assert read.upload_stall is None


def test_a_malformed_stall_is_dropped_not_the_progress_and_a_long_fault_is_cut() -> None:
    raw = json.loads(logged(upload_stall=STALL).to_json())
    for bad in ("x", [1], {"since": "then", "fault": "x"}, {"since": float("inf"), "fault": "x"}, {"since": 1.0}):
        raw["upload_stall"] = bad
        read = AttemptProgress.from_json(json.dumps(raw).encode())
        assert read.upload_stall is None, bad
        assert read.points == [(40, 2.5, SINCE)]
    raw["upload_stall"] = {"since": SINCE, "fault": "x" * 10_000}
    read = AttemptProgress.from_json(json.dumps(raw).encode())
    assert read.upload_stall == UploadStallNote(SINCE, "x" * MAX_STALL_FAULT_CHARS)
    old = json.loads(logged().to_json())
    del old["upload_stall"]
    assert AttemptProgress.from_json(json.dumps(old).encode()).upload_stall is None, "objects of older jobs read"


def test_the_controller_puts_the_stall_in_status_progress() -> None:
    progress, _ = progress_status(logged(upload_stall=STALL))
    assert progress is not None
    assert progress.upload_stalled_since == "2026-11-27T09:52:58Z"
    assert progress.upload_stall_fault == STALL.fault
    flowing, _ = progress_status(logged())
    assert flowing is not None
    assert (flowing.upload_stalled_since, flowing.upload_stall_fault) == (None, None)


def test_spotray_status_says_the_uploads_stall_while_it_lasts() -> None:
    progress, _ = progress_status(logged(upload_stall=STALL))
    assert progress is not None
    run = {
        "metadata": {"name": "gpt2", "namespace": "team-a", "creationTimestamp": "2026-11-27T09:00:00Z"},
        "status": {"phase": "Running", "attempt": 2, "progress": progress.to_status()},
    }
    text = describe_run(run, datetime.fromtimestamp(SINCE + 120, UTC))
    assert (
        "Uploads:         stalled since 2026-11-27T09:52:58Z (2m ago): the store answers "
        "503 SlowDown (Please reduce your request rate.); checkpoints wait or are dropped until it answers"
    ) in text
    run["status"]["progress"] = progress_status(logged())[0].to_status()  # type: ignore[union-attr]
    assert "Uploads:" not in describe_run(run, datetime.fromtimestamp(SINCE + 120, UTC))


def test_rank_0_writes_a_stall_when_it_starts_and_clears_it_when_uploads_flow(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: PLC0415 - [train] only

    from spotray.train.checkpoints.upload_worker import UploadStall  # noqa: PLC0415
    from spotray.train.hf.progress import ProgressCallback  # noqa: PLC0415
    from spotray.train.records.event_log import EventLog  # noqa: PLC0415

    writer = ProgressWriter(open_store(str(tmp_path / "ckpt")), AttemptProgress(attempt=1, run_id="r1"), 3600)
    sync = SimpleNamespace(upload_stall=None)  # the S3 callback's part: what the upload process last said
    callback = ProgressCallback(sync, EventLog(tmp_path / "events.jsonl"), writer)  # type: ignore[arg-type]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])

    def log_step() -> UploadStallNote | None:
        callback.on_log(args, TrainerState(global_step=1), TrainerControl(), logs={"loss": 1.0})
        return writer.progress.upload_stall

    assert log_step() is None
    sync.upload_stall = UploadStall(action="put checkpoint-10/model.safetensors", fault=STALL.fault, at=SINCE)
    assert log_step() == STALL
    sync.upload_stall = None
    assert log_step() is None
    assert writer.close()
