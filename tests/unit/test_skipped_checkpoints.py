"""A run says which newer checkpoints it did not resume from, and why (issue #69, item 1).

Resume passes over a complete checkpoint that is corrupt or that this job cannot load, for the next
older one: right, but it was said only in a worker's log, so a run that trained steps again looked
like any other. Now the job records what it passed over in its progress object and its `start`
event; the controller puts it in the attempt's status (``skippedCheckpoints``) and in the running
run's message (``kubectl get``), `spotray status` lists it, and local mode prints it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from spotray.cli.run_status import describe_run
from spotray.contract.attempts import AttemptId
from spotray.contract.status import AttemptStatus, RunStatus
from spotray.controller.reconcile import passed_over
from spotray.controller.run_store import StoreReports
from spotray.local.progress import ProgressView
from spotray.train.checkpoints.checkpoint import upload_checkpoint
from spotray.train.checkpoints.resume import fetch_resume_checkpoint
from spotray.train.records.progress_log import MAX_SKIPPED_CHARS, AttemptProgress
from spotray.train.storage.store import open_store
from tests.conftest import write_files

pytestmark = pytest.mark.unit

CORRUPT = "checkpoint-40: model.safetensors: sha256 does not match the manifest"


def test_resume_lists_the_newer_checkpoints_it_passed_over(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    for step in (10, 20, 40):
        upload_checkpoint(store, write_files(tmp_path / f"src-{step}", {"model.bin": bytes([step]) * 64}), step, 1)
    for step in (10, 40):  # damaged: one newer than the checkpoint resumed from, one older
        (tmp_path / "store" / f"checkpoint-{step}" / "model.bin").write_bytes(b"not what the manifest says")
    skipped: list[str] = []
    point = fetch_resume_checkpoint(store, tmp_path / "resume", skipped=skipped)
    assert point is not None
    assert point.step == 20
    assert skipped == ["checkpoint-40: file model.bin has 26 bytes, the manifest says 64"]


def test_the_progress_object_carries_them_within_bounds() -> None:
    many = [CORRUPT, "x" * 5000, *(f"checkpoint-{n}: bad" for n in range(10))]
    progress = AttemptProgress(2, "uid-1", resumed_from=20, skipped_checkpoints=many)
    read = AttemptProgress.from_json(progress.to_json())
    assert read.skipped_checkpoints[0] == CORRUPT
    assert len(read.skipped_checkpoints) == 5
    assert len(read.skipped_checkpoints[1]) == MAX_SKIPPED_CHARS
    hostile = json.loads(progress.to_json())
    hostile["skipped_checkpoints"] = [{"step": 1}]
    with pytest.raises(ValueError, match="skipped_checkpoints"):
        AttemptProgress.from_json(json.dumps(hostile).encode())


def test_the_controller_reads_them_into_the_attempts_status_and_message(tmp_path: Path) -> None:
    store, attempt = open_store(str(tmp_path / "store")), AttemptId("uid-1", 2)
    progress = AttemptProgress(2, "uid-1", resumed_from=20, max_steps=100, skipped_checkpoints=[CORRUPT])
    store.put_bytes(attempt.progress_key, progress.to_json())
    report = StoreReports().read(store, attempt, ended=False)
    assert report.skipped_checkpoints == (CORRUPT,)
    current = AttemptStatus(attempt=2, resumed_from=20, skipped_checkpoints=report.skipped_checkpoints)
    assert passed_over(current) == f" (resumed from checkpoint-20, passing over {CORRUPT})"
    assert passed_over(AttemptStatus(attempt=2, resumed_from=20)) == ""
    # The status field survives the patch and the read back, as the API server stores it.
    status = RunStatus(attempts=(current,))
    assert RunStatus.from_status(status.to_patch()).attempts == (current,)


def test_spotray_status_and_local_mode_say_them() -> None:
    run = {
        "metadata": {"name": "gpt2", "namespace": "default", "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {},
        "status": RunStatus(
            phase="Running",
            attempts=(AttemptStatus(attempt=1, outcome="Running", resumed_from=20, skipped_checkpoints=(CORRUPT,)),),
        ).to_patch(),
    }
    assert f"attempt 1 passed over {CORRUPT}" in describe_run(run)
    out = io.StringIO()
    ProgressView(stream=out).on_event({"event": "start", "resumed_from": 20, "world_size": 1,
                                       "skipped_checkpoints": [CORRUPT]})  # fmt: skip
    assert f"passed over {CORRUPT}" in out.getvalue()
