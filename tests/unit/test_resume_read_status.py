"""Where an attempt's resume read its checkpoint, in its status (issue 73, item 2: "the status ledger says
where each resume read from"). On several nodes a resume reads each file from S3 once, or from the copies
the nodes kept of their saves (train/checkpoints/node_copies.py), and the nodes exchange the rest: the job
records the bytes of each in its progress object, the controller puts them in the attempt's status
(``resumeRead``), and `spotray status` says them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spotray.cli.run_status import describe_run
from spotray.contract.attempts import AttemptId
from spotray.contract.status import AttemptStatus, ResumeRead, RunStatus
from spotray.controller.run_store import StoreReports
from spotray.train.records.progress_log import AttemptProgress
from spotray.train.storage.store import open_store

pytestmark = pytest.mark.unit

READ = {"nodes": 4, "s3_bytes": 0, "peer_bytes": 3_000_000, "kept_bytes": 1 << 20, "completed_bytes": 2 << 20}


def test_the_progress_object_carries_where_the_resume_read_from_and_refuses_nonsense() -> None:
    progress = AttemptProgress(2, "uid-1", resumed_from=20, resume_read=READ)
    assert AttemptProgress.from_json(progress.to_json()).resume_read == READ
    hostile = json.loads(progress.to_json())
    hostile["resume_read"] = {"nodes": 4, "s3_bytes": -1}
    with pytest.raises(ValueError, match="s3_bytes"):
        AttemptProgress.from_json(json.dumps(hostile).encode())


def test_the_controller_puts_it_in_the_attempts_status_and_spotray_status_says_it(tmp_path: Path) -> None:
    store, attempt = open_store(str(tmp_path / "store")), AttemptId("uid-1", 2)
    progress = AttemptProgress(2, "uid-1", resumed_from=20, max_steps=100, resume_read=READ)
    store.put_bytes(attempt.progress_key, progress.to_json())
    report = StoreReports().read(store, attempt, ended=False)
    assert report.resume_read == ResumeRead(
        nodes=4, s3_bytes=0, peer_bytes=3_000_000, kept_bytes=1 << 20, completed_bytes=2 << 20
    )
    current = AttemptStatus(attempt=2, outcome="Running", resumed_from=20, resume_read=report.resume_read)
    status = RunStatus(phase="Running", attempts=(current,))
    assert RunStatus.from_status(status.to_patch()).attempts == (current,), "lost in the patch or the read back"
    run = {
        "metadata": {"name": "gpt2", "namespace": "default", "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {},
        "status": status.to_patch(),
    }
    said = describe_run(run)
    assert "attempt 2 read checkpoint-20 on 4 nodes: 0 B from S3, 1.0 MiB from the nodes' copies" in said, said
    # The checkpoint's upload had not finished when the attempt before ended: the nodes completed it.
    assert "checkpoint-20 completed in S3 from the nodes' copies (2.0 MiB uploaded)" in said, said
    without = replace(current, resume_read=replace(current.resume_read, completed_bytes=0))
    assert "completed in S3" not in describe_run(run | {"status": replace(status, attempts=(without,)).to_patch()})
