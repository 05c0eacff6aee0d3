"""The records the controller acts on are signed with the run's key (issue #69, item 5).

Before: the controller held the run's key and checked checkpoint manifests with it, but acted on
records it never checked. A writer of the bucket without the key could write ``attempt-N.json`` with
exit code 0 and end a stalled run as Succeeded, or a progress object whose ``worker_hosts`` call the
training worker idle and have the controller delete it through ``workersToDelete``, again every
backoff. Now every record and progress object a keyed job writes carries an HMAC, and a keyed
reader takes an unsigned or forged one for unreadable: never a fact.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId, AttemptOutcome
from spotray.contract.checkpoint_key import SIGNATURE_FIELD, CheckpointKey
from spotray.contract.uris import parse_uri
from spotray.train.records.attempt_records import (
    read_attempt_records,
    read_fence,
    write_fence,
    write_outcome,
    write_preemption,
)
from spotray.train.records.progress_log import AttemptProgress, WorkerHosts, read_attempt_progress
from spotray.train.storage.store import LocalObjectStore

pytestmark = pytest.mark.unit

KEY = CheckpointKey(b"k" * 64)
OTHER = CheckpointKey(b"o" * 64)
ATTEMPT = AttemptId("run-1", 2)


def stores(tmp_path: Path, writer_key: CheckpointKey | None) -> tuple[LocalObjectStore, LocalObjectStore]:
    """The run's keyed view of its bucket, and a writer's with ``writer_key`` (None: a writer without a key)."""
    uri = parse_uri(str(tmp_path / "bucket"))
    return LocalObjectStore(uri, checkpoint_key=KEY), LocalObjectStore(uri, checkpoint_key=writer_key)


def test_a_keyed_job_signs_its_records_and_a_keyed_reader_takes_them(tmp_path: Path) -> None:
    run, _ = stores(tmp_path, None)
    write_outcome(run, ATTEMPT, AttemptOutcome(exit_code=0, step=30, detail="finished"))
    write_preemption(run, ATTEMPT, 20, 1.5)
    write_fence(run, ATTEMPT, resumed_from=10)
    stored = json.loads((run.root / ATTEMPT.outcome_key).read_bytes())
    assert len(stored[SIGNATURE_FIELD]) == 64
    records = read_attempt_records(run, ATTEMPT)
    assert records.exit_code == 0
    assert records.preempted is not None
    fence = read_fence(run)
    assert fence is not None
    assert fence.resumed_from == 10


@pytest.mark.parametrize("forger_key", [None, OTHER], ids=["unsigned", "another-key"])
def test_a_forged_outcome_is_unreadable_not_a_success(tmp_path: Path, forger_key: CheckpointKey | None) -> None:
    run, forger = stores(tmp_path, forger_key)
    write_outcome(forger, ATTEMPT, AttemptOutcome(exit_code=0, step=30, detail="finished"))
    write_preemption(forger, ATTEMPT, 20, 1.5)
    records = read_attempt_records(run, ATTEMPT)
    assert records.outcome is None
    assert records.preempted is None
    assert records.exit_code is None
    # The writer's own view (no key, or its own) takes it: the run's key is what tells them apart.
    assert read_attempt_records(forger, ATTEMPT).exit_code == 0


@pytest.mark.parametrize("forger_key", [None, OTHER], ids=["unsigned", "another-key"])
def test_a_forged_fence_is_no_fence(tmp_path: Path, forger_key: CheckpointKey | None) -> None:
    run, forger = stores(tmp_path, forger_key)
    write_fence(forger, AttemptId("run-1", 99))
    assert read_fence(run) is None


@pytest.mark.parametrize("forger_key", [None, OTHER], ids=["unsigned", "another-key"])
def test_forged_worker_hosts_never_reach_the_controller(tmp_path: Path, forger_key: CheckpointKey | None) -> None:
    run, forger = stores(tmp_path, forger_key)
    hosts = WorkerHosts(idle=("worker-training",), busy=("worker-spare",), time=1_795_773_178.0)
    progress = AttemptProgress(attempt=ATTEMPT.attempt, run_id=ATTEMPT.run_id, updated=1_795_773_178.0)
    progress.worker_hosts = hosts
    forger.put_bytes(ATTEMPT.progress_key, progress.to_json(forger.checkpoint_key))
    assert read_attempt_progress(run, ATTEMPT) is None
    run.put_bytes(ATTEMPT.progress_key, progress.to_json(run.checkpoint_key))
    read = read_attempt_progress(run, ATTEMPT)
    assert read is not None
    assert read.worker_hosts == hosts


def test_worker_hosts_from_before_the_groups_last_restart_are_not_acted_on() -> None:
    """Issue #69: after a restart the carried-over view could call idle the spare the new group started
    on, and the controller would move (delete) it, for up to 60 s."""
    hosts = WorkerHosts(idle=("spare",), busy=("worker",), time=1_795_773_178.0)
    progress = AttemptProgress(attempt=1, run_id="run-1", worker_hosts=hosts)
    assert progress.current_worker_hosts == hosts
    progress.restarts.append((20, hosts.time + 1))
    assert progress.current_worker_hosts is None
    progress.worker_hosts = replace(hosts, time=hosts.time + 2)  # the new group's own view
    assert progress.current_worker_hosts == progress.worker_hosts
