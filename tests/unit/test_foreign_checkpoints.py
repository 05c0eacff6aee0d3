"""Checkpoints a run cannot verify are never trained over, pruned or silently skipped (issue #69, item 1).

Reproduced before the fix: a run created again on the same URI got a new key; its job skipped every
checkpoint there ("has a signature that does not match the run's key", in worker logs only), said
"fresh start", trained from step 0 and wrote checkpoint-20, -40, -60 over the first run's. Now a
checkpoint whose manifest is whole but not signed with the reader's key is *foreign*: a job refuses
to start below it (bad input, naming it and the fix), and pruning never deletes it. One the run can
verify that is newer than every foreign one is resumed from as before.

On a directory store; the same code reads S3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import Cause, ForeignCheckpointError, cause_of
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import list_checkpoints, prune_checkpoints, upload_checkpoint
from spotray.train.checkpoints.resume import agree_on_resume_point, fetch_resume_checkpoint
from spotray.train.storage.store import LocalObjectStore
from tests.conftest import write_files

pytestmark = pytest.mark.unit

FIRST_KEY = CheckpointKey(b"1" * 64)
SECOND_KEY = CheckpointKey(b"2" * 64)
FILES = {"model.safetensors": b"m" * 100, "trainer_state.json": b"{}"}


def store(root: Path, key: CheckpointKey | None) -> LocalObjectStore:
    return LocalObjectStore(parse_uri(str(root / "bucket")), checkpoint_key=key)


def save(run: LocalObjectStore, root: Path, *steps: int) -> None:
    local = write_files(root / "local", FILES)
    for step in steps:
        upload_checkpoint(run, local, step, world_size=1)


@pytest.mark.parametrize(
    ("first_key", "second_key"),
    [(FIRST_KEY, SECOND_KEY), (None, SECOND_KEY)],
    ids=["created-again-with-a-new-key", "keys-turned-on-midway"],
)
def test_a_run_never_starts_fresh_on_top_of_checkpoints_it_cannot_verify(
    tmp_path: Path, first_key: CheckpointKey | None, second_key: CheckpointKey
) -> None:
    save(store(tmp_path, first_key), tmp_path, 20, 40, 60)
    again = store(tmp_path, second_key)
    with pytest.raises(ForeignCheckpointError) as refused:
        agree_on_resume_point(again, tmp_path / "resume")
    error = refused.value
    assert cause_of(error) is Cause.BAD_INPUT, "bad input: the next attempt would do the same"
    assert "checkpoint-60" in error.problem, "names the newest of them"
    assert "start from step 0" in error.problem
    assert "spec.checkpoint.keySecret" in error.fix
    assert "SPOTRAY_CHECKPOINT_KEY" in error.fix
    assert [c.step for c in list_checkpoints(store(tmp_path, None)) if c.complete] == [60, 40, 20], "all still there"


def test_the_same_key_resumes_from_the_newest(tmp_path: Path) -> None:
    """The namespace's key, kept across runs: a run created again resumes."""
    save(store(tmp_path, FIRST_KEY), tmp_path, 20, 40, 60)
    point = agree_on_resume_point(store(tmp_path, FIRST_KEY), tmp_path / "resume")
    assert point is not None
    assert point.step == 60


def test_a_foreign_checkpoint_newer_than_the_runs_own_is_refused_not_skipped(tmp_path: Path) -> None:
    """Resuming from the older signed one would train the steps up to 40 again and write over checkpoint-40."""
    save(store(tmp_path, FIRST_KEY), tmp_path, 20)
    save(store(tmp_path, SECOND_KEY), tmp_path / "b", 40)
    with pytest.raises(ForeignCheckpointError, match="resume from the older checkpoint-20"):
        fetch_resume_checkpoint(store(tmp_path, FIRST_KEY), tmp_path / "resume")


def test_a_foreign_checkpoint_older_than_the_runs_newest_stands_in_no_way(tmp_path: Path) -> None:
    save(store(tmp_path, SECOND_KEY), tmp_path / "b", 20)
    save(store(tmp_path, FIRST_KEY), tmp_path, 40)
    point = fetch_resume_checkpoint(store(tmp_path, FIRST_KEY), tmp_path / "resume")
    assert point is not None
    assert point.step == 40


def test_pruning_never_deletes_a_checkpoint_the_run_cannot_verify(tmp_path: Path) -> None:
    save(store(tmp_path, SECOND_KEY), tmp_path / "b", 10, 20)
    run = store(tmp_path, FIRST_KEY)
    save(run, tmp_path, 30, 40, 50)
    assert prune_checkpoints(run, keep=1) == [30, 40]
    left = {c.step: c for c in list_checkpoints(store(tmp_path, None))}
    assert sorted(left) == [10, 20, 50]
    assert all(left[step].complete for step in (10, 20)), "the other key's checkpoints are untouched"
