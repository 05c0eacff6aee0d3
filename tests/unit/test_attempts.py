"""spotray/contract/attempts.py and its users: identity-checked records, the fence, and what pruning never deletes."""

from dataclasses import replace
from pathlib import Path

import pytest

from spotray.contract.attempts import MAX_DETAIL_CHARS, AttemptId, AttemptOutcome, Fence
from spotray.contract.errors import Cause, SpotrayError, cause_of
from spotray.train.checkpoints.checkpoint import (
    latest_complete_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.resume import fetch_resume_checkpoint
from spotray.train.records.attempt_records import (
    SupersededError,
    check_fence,
    read_attempt_records,
    read_fence,
    write_fence,
    write_outcome,
    write_preemption,
)
from spotray.train.storage.store import ObjectStore, open_store

pytestmark = [pytest.mark.unit, pytest.mark.core]


def store_at(tmp_path: Path) -> ObjectStore:
    return open_store(str(tmp_path / "ckpt"))


def checkpoint_files(tmp_path: Path, step: int) -> Path:
    local = tmp_path / "local" / f"checkpoint-{step}"
    local.mkdir(parents=True)
    (local / "model.bin").write_bytes(bytes([step % 256]) * 64)
    return local


def test_records_are_read_only_by_the_attempt_that_wrote_them(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    old_run, new_run = AttemptId("uid-old", 1), AttemptId("uid-new", 1)
    write_preemption(store, old_run, step=30, seconds_after_notice=1.0)
    write_outcome(store, old_run, AttemptOutcome(143, 30, "preempted"))
    assert read_attempt_records(store, old_run).exit_code == 143
    assert read_attempt_records(store, new_run) == read_attempt_records(store, AttemptId("uid-old", 2))
    assert read_attempt_records(store, new_run).preempted is None
    # A record copied under another attempt's key still names its writer, and is ignored.
    store.put_bytes(new_run.preemption_key, store.get_bytes(old_run.preemption_key))
    assert read_attempt_records(store, new_run).preempted is None


def test_an_outcome_with_an_error_text_of_any_length_is_a_record_its_readers_read(tmp_path: Path) -> None:
    """An exception's text can be any length; escaped, a character past the BMP takes twelve bytes."""
    store, attempt = store_at(tmp_path), AttemptId("uid", 1)
    write_outcome(store, attempt, AttemptOutcome(1, 7, "training failed: ValueError: " + "\U0001f600" * 2_000_000))
    outcome = read_attempt_records(store, attempt).outcome
    assert outcome is not None
    assert outcome["detail"].startswith("training failed: ValueError: ")
    assert outcome["detail"].endswith(" [cut]")
    assert len(outcome["detail"]) == MAX_DETAIL_CHARS + len(" [cut]")


@pytest.mark.parametrize("run_id", ["../x", "a/b", "", "x" * 65, "-lead"])
def test_a_run_id_must_be_a_plain_key_segment(run_id: str) -> None:
    with pytest.raises(SpotrayError, match="not a plain name"):
        AttemptId(run_id, 1)


def test_a_superseded_attempt_completes_no_checkpoint_and_prunes_nothing(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    old, new = AttemptId("uid-1", 1), AttemptId("uid-1", 2)
    write_fence(store, old)
    upload_checkpoint(store, checkpoint_files(tmp_path, 10), 10, 1, attempt=old)
    write_fence(store, new, resumed_from=10)  # the next attempt started while the old one drains
    with pytest.raises(SupersededError, match="attempt 2 of run uid-1 now owns"):
        upload_checkpoint(store, checkpoint_files(tmp_path, 20), 20, 1, attempt=old)
    with pytest.raises(SupersededError):
        prune_checkpoints(store, keep=1, attempt=old)
    assert [c.step for c in list_checkpoints(store)] == [10]
    assert read_fence(store).resumed_from == 10


def test_prune_keeps_the_step_the_running_attempt_resumed_from(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    attempt = AttemptId("uid-1", 2)
    for step in (10, 20):
        upload_checkpoint(store, checkpoint_files(tmp_path, step), step, 1)
    write_fence(store, attempt, resumed_from=10)
    upload_checkpoint(store, checkpoint_files(tmp_path, 30), 30, 1, attempt=attempt)
    deleted = prune_checkpoints(store, keep=1, attempt=attempt, just_uploaded=30)
    assert deleted == [20]
    assert sorted(c.step for c in list_checkpoints(store)) == [10, 30]


def test_a_corrupt_newer_checkpoint_never_makes_prune_delete_the_one_just_uploaded(tmp_path: Path) -> None:
    """keep=1 with a newest checkpoint whose sizes are right and bytes wrong: the new good one must stay."""
    store = store_at(tmp_path)
    upload_checkpoint(store, checkpoint_files(tmp_path, 60), 60, 1)
    store.put_bytes("checkpoint-60/model.bin", b"\xff" * 64)  # same size, bad bytes: "complete" by sizes
    upload_checkpoint(store, checkpoint_files(tmp_path, 55), 55, 1)  # resumed from an older one, trained on
    prune_checkpoints(store, keep=1, just_uploaded=55)
    assert sorted(c.step for c in list_checkpoints(store)) == [55, 60]
    assert latest_complete_checkpoint(store).step == 60  # by sizes; resume verifies and falls back to 55


class PrunedWhileListed:
    """The store as a reader meets it while another process prunes: checkpoint-20 goes right after the LIST."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.pruned = False

    def list(self, prefix: str):
        listed = self.inner.list(prefix)
        if prefix == "checkpoint-" and not self.pruned:
            self.pruned = True
            self.inner.delete([o.key for o in self.inner.list("checkpoint-20/")])
        return listed

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_checkpoint_pruned_between_list_and_read_is_skipped_not_fatal(tmp_path: Path) -> None:
    """Found by make chaos: resume listed checkpoint-20, an old attempt's prune deleted it, the read crashed."""
    store = store_at(tmp_path)
    for step in (10, 20):
        upload_checkpoint(store, checkpoint_files(tmp_path, step), step, 1)
    racing = PrunedWhileListed(store)
    point = fetch_resume_checkpoint(racing, tmp_path / "resume")  # type: ignore[arg-type]
    assert point is not None
    assert point.step == 10


def test_a_fence_another_run_left_is_taken_over_and_a_newer_attempt_still_supersedes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another run given the same URI left its fence (issue #36): this run is not stopped by it."""
    store = store_at(tmp_path)
    this, newer = AttemptId("uid-1", 1), AttemptId("uid-1", 2)
    write_fence(store, AttemptId("uid-other", 7), resumed_from=70)
    assert check_fence(store, this) == Fence("uid-1", 1)
    assert "run uid-other" in caplog.text
    assert read_fence(store) == Fence("uid-1", 1)
    write_fence(store, newer)
    with pytest.raises(SupersededError) as caught:
        check_fence(store, this)
    assert cause_of(caught.value) is Cause.INFRASTRUCTURE


def test_an_older_attempt_that_took_a_fence_over_does_not_supersede_the_newer_one(tmp_path: Path) -> None:
    """Another run's fence replaced attempt 2's while attempt 1 still drained, and attempt 1 took it over:
    attempt 2 takes it back, and attempt 1 is superseded again."""
    store = store_at(tmp_path)
    older, newer = AttemptId("uid-1", 1), AttemptId("uid-1", 2)
    write_fence(store, AttemptId("uid-other", 7))
    check_fence(store, older)
    assert check_fence(store, newer) == Fence("uid-1", 2)
    with pytest.raises(SupersededError):
        check_fence(store, older)


def test_a_run_that_took_over_the_claim_of_a_run_that_still_runs_stops_as_bad_input(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two runs that both still write to one URI would take the fence from each other for ever: the run
    that claimed it comes back for it, and the one that took it over stops (give each run its own URI)."""
    store = store_at(tmp_path)
    this, other = AttemptId("uid-1", 1), AttemptId("uid-other", 7)
    write_fence(store, other)  # the other run's driver claims the URI after this one's
    assert check_fence(store, this) == Fence("uid-1", 1)  # taken over, as if left behind ...
    assert check_fence(store, other) == Fence("uid-other", 7)  # ... but the other run still runs
    assert "takes back" in caplog.text
    with pytest.raises(SupersededError) as caught:
        check_fence(store, this)
    assert cause_of(caught.value) is Cause.BAD_INPUT
    assert check_fence(store, other) == Fence("uid-other", 7)


def test_a_deleted_runs_job_saving_on_its_way_out_never_takes_the_uri_back_from_the_run_created_again(
    tmp_path: Path,
) -> None:
    """Issue #69: `kubectl delete trainingrun` then `kubectl apply` of the same file. The deleted run's job
    gets its notice (KubeRay stops it; its pods drain) and saves its emergency checkpoint after the run
    created again claimed the URI: it took the claim back, and the new run, at its next save, stopped as
    bad input ("two runs write to one URI") and failed for good. An attempt on its way out (its notice
    stops it) never takes a URI over or back: it stops writing, and the run that holds the URI goes on."""
    store = store_at(tmp_path)
    deleted, created = AttemptId("uid-deleted", 3), AttemptId("uid-new", 1)
    write_fence(store, deleted)
    assert check_fence(store, created) == Fence("uid-new", 1)  # the new run's attempt 1 takes it over
    leaving = replace(deleted, leaving=True)
    with pytest.raises(SupersededError):
        upload_checkpoint(store, checkpoint_files(tmp_path, 57), 57, 1, attempt=leaving)
    assert not store.list("checkpoint-57/")  # nothing of it written
    assert check_fence(store, created) == Fence("uid-new", 1)  # the new run goes on
    # Its own claim, the attempt on its way out still commits its emergency checkpoint.
    write_fence(store, deleted)
    upload_checkpoint(store, checkpoint_files(tmp_path, 58), 58, 1, attempt=leaving)
    assert store.list("checkpoint-58/")
