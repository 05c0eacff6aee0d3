"""``checkpoint.startFrom`` (train/checkpoints/start_from.py) against a real SeaweedFS: another run's
checkpoint copied into this run's prefix in place of its own, once, manifest-aware, a copy cut short
repeated whole, a pruned source replaced by its newest later one, and a source signed with another
run's key refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import SpotrayError
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    complete_checkpoints,
    delete_checkpoint,
    download_checkpoint,
    list_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.start_from import start_from
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import LocalObjectStore, RetryPolicy, S3ObjectStore
from tests.conftest import write_files

pytestmark = [pytest.mark.integration, pytest.mark.core]

ATTEMPT = AttemptId("run-recipient", 3)


@pytest.fixture
def stores(
    s3_server: LocalS3Server, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[S3ObjectStore, S3ObjectStore]:
    """The donor run's store and the recipient's, side by side under one prefix, as a sweep's trials are."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)  # the source is opened as the job opens stores: from its environment
    monkeypatch.delenv("SPOTRAY_CHECKPOINT_KEY", raising=False)
    return tuple(  # type: ignore[return-value]
        S3ObjectStore(parse_uri(f"{s3_uri}/{run}"), s3_server.config, RetryPolicy(deadline_s=30))
        for run in ("donor", "recipient")
    )


def save(store: S3ObjectStore, tmp_path: Path, step: int, tag: str) -> dict[str, bytes]:
    files = {"model.safetensors": os.urandom(4096) + tag.encode(), "trainer_state.json": b'{"global_step": %d}' % step}
    upload_checkpoint(store, write_files(tmp_path / f"{tag}-{step}", files), step, world_size=2, resume={"tag": tag})
    return files


def contents(store: S3ObjectStore, step: int, tmp_path: Path) -> dict[str, bytes]:
    info = next(info for info in complete_checkpoints(store) if info.step == step)
    local = download_checkpoint(store, info, tmp_path / f"read-{step}-{os.urandom(4).hex()}")
    return {name: (local / name).read_bytes() for name in info.manifest.files} if info.manifest else {}


def test_the_donors_checkpoint_replaces_the_runs_own_once(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path
) -> None:
    donor, recipient = stores
    save(donor, tmp_path, 10, "donor")
    wanted = save(donor, tmp_path, 20, "donor")
    for step in (10, 30):
        save(recipient, tmp_path, step, "own")
    uri = str(donor.uri.join("checkpoint-20"))

    def through_this_machine(*_: object, **__: object) -> None:
        raise AssertionError("one S3 endpoint, the same credentials: the copy stays inside S3")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(S3ObjectStore, "download_files", through_this_machine)
        copied = start_from(recipient, uri, ATTEMPT)

    assert copied is not None
    assert (copied.step, copied.replaced) == (20, 2)
    assert [info.step for info in list_checkpoints(recipient)] == [20], "the run's own checkpoints are gone"
    assert contents(recipient, 20, tmp_path) == wanted
    manifest = complete_checkpoints(recipient)[0].manifest
    assert manifest is not None
    assert (manifest.world_size, manifest.resume) == (2, {"tag": "donor"}), "the resume state travels"
    # Done once: the run trains on and checkpoints; the next attempt (same spec) resumes from its own.
    save(recipient, tmp_path, 30, "own-after")
    assert start_from(recipient, uri, AttemptId(ATTEMPT.run_id, 4)) is None
    assert [info.step for info in complete_checkpoints(recipient)] == [30, 20]
    # A new run (another id) with the same startFrom copies it for itself.
    assert start_from(recipient, uri, AttemptId("run-recreated", 1)) is not None


def test_a_copy_cut_short_before_its_manifest_is_repeated_whole(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    donor, recipient = stores
    wanted = save(donor, tmp_path, 20, "donor")
    save(recipient, tmp_path, 30, "own")
    uri = str(donor.uri.join("checkpoint-20"))
    real_put = S3ObjectStore.put_bytes

    def killed_at_the_manifest(store: S3ObjectStore, key: str, data: bytes) -> None:
        if key.endswith(MANIFEST_NAME) and store is recipient:
            raise ConnectionError("the job died here")
        real_put(store, key, data)

    monkeypatch.setattr(S3ObjectStore, "put_bytes", killed_at_the_manifest)
    with pytest.raises(ConnectionError):
        start_from(recipient, uri, ATTEMPT)
    monkeypatch.setattr(S3ObjectStore, "put_bytes", real_put)
    assert complete_checkpoints(recipient) == [], "half a copy is no checkpoint (the run's own went once it was staged)"

    copied = start_from(recipient, uri, AttemptId(ATTEMPT.run_id, ATTEMPT.attempt + 1))

    assert copied is not None
    assert copied.step == 20
    assert contents(recipient, 20, tmp_path) == wanted


def test_a_source_pruned_while_it_is_copied_gives_way_to_its_next_and_the_runs_own_stay_until_then(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #69: the run's own checkpoints were deleted first, then the donor pruned the named one
    mid-copy; the 404 was taken for bad input, and the trial failed for good with nothing left."""
    donor, recipient = stores
    save(donor, tmp_path, 20, "donor")
    later = save(donor, tmp_path, 30, "donor")
    save(recipient, tmp_path, 10, "own")
    real_copy_in = S3ObjectStore.copy_in
    pruned: list[int] = []

    def donor_prunes_meanwhile(store: S3ObjectStore, source: S3ObjectStore, pairs: list[tuple[str, str]]) -> None:
        if not pruned:
            assert [c.step for c in complete_checkpoints(recipient)] == [10], "the run's own are still there"
            delete_checkpoint(donor, next(c for c in list_checkpoints(donor) if c.step == 20))
            pruned.append(20)
        real_copy_in(store, source, pairs)

    monkeypatch.setattr(S3ObjectStore, "copy_in", donor_prunes_meanwhile)
    copied = start_from(recipient, str(donor.uri.join("checkpoint-20")), ATTEMPT)

    assert pruned == [20]
    assert copied is not None
    assert (copied.step, copied.replaced) == (30, 1), "the donor's next; the run's own replaced only then"
    assert contents(recipient, 30, tmp_path) == later
    assert recipient.list("_spotray/run-recipient/start-from/") == [], "the staged copy is gone"


def test_a_job_killed_after_its_own_checkpoints_went_takes_the_staged_copy_not_the_source(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    donor, recipient = stores
    wanted = save(donor, tmp_path, 20, "donor")
    save(recipient, tmp_path, 30, "own")
    uri = str(donor.uri.join("checkpoint-20"))
    real_put = S3ObjectStore.put_bytes

    def killed_at_the_swap(store: S3ObjectStore, key: str, data: bytes) -> None:
        if store is recipient and key == f"checkpoint-20/{MANIFEST_NAME}":
            raise ConnectionError("the job died here")
        real_put(store, key, data)

    monkeypatch.setattr(S3ObjectStore, "put_bytes", killed_at_the_swap)
    with pytest.raises(ConnectionError):
        start_from(recipient, uri, ATTEMPT)
    monkeypatch.setattr(S3ObjectStore, "put_bytes", real_put)
    for info in list_checkpoints(donor):  # the donor moved on and pruned it: the staged copy is what is left
        delete_checkpoint(donor, info)

    copied = start_from(recipient, uri, AttemptId(ATTEMPT.run_id, ATTEMPT.attempt + 1))

    assert copied is not None
    assert copied.step == 20
    assert contents(recipient, 20, tmp_path) == wanted


def test_a_pruned_source_gives_its_newest_later_or_else_newest_checkpoint_and_none_is_bad_input(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path
) -> None:
    donor, recipient = stores
    for step in (20, 30):
        save(donor, tmp_path, step, "donor")
    later = save(donor, tmp_path, 40, "donor")
    delete_checkpoint(donor, next(info for info in list_checkpoints(donor) if info.step == 20))

    copied = start_from(recipient, str(donor.uri.join("checkpoint-20")), ATTEMPT)

    assert copied is not None
    assert copied.step == 40, "the newest complete one after the pruned step"
    assert contents(recipient, 40, tmp_path) == later
    # Nothing at or after step 50: the newest there is (a donor whose own exploit replaced its checkpoints).
    copied = start_from(recipient, str(donor.uri.join("checkpoint-50")), AttemptId(ATTEMPT.run_id, 9))
    assert copied is not None
    assert copied.step == 40
    nobody = str(donor.uri).removesuffix("/donor") + "/nobody/checkpoint-10"
    with pytest.raises(SpotrayError) as refused:
        start_from(recipient, nobody, ATTEMPT)
    assert "the run there has no complete checkpoint" in refused.value.problem
    assert "remove startFrom" in refused.value.fix


def test_a_source_signed_with_another_runs_key_is_refused_and_one_with_the_same_key_is_copied(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path
) -> None:
    donor, recipient = stores
    shared, other = CheckpointKey(b"k" * 32), CheckpointKey(b"o" * 32)
    donor.checkpoint_key, recipient.checkpoint_key = other, shared
    save(donor, tmp_path, 20, "donor")
    uri = str(donor.uri.join("checkpoint-20"))
    with pytest.raises(SpotrayError, match="signed with another key than this run's counts as incomplete"):
        start_from(recipient, uri, ATTEMPT)

    donor.checkpoint_key = shared
    wanted = save(donor, tmp_path, 30, "donor")
    copied = start_from(recipient, str(donor.uri.join("checkpoint-30")), ATTEMPT)

    assert copied is not None
    assert contents(recipient, 30, tmp_path) == wanted
    manifest = complete_checkpoints(recipient)[0].manifest
    assert manifest is not None
    assert manifest.signed, "the copy is signed with the run's key"


def test_into_another_store_the_copy_goes_through_this_machine_verified(
    stores: tuple[S3ObjectStore, S3ObjectStore], tmp_path: Path
) -> None:
    donor, _ = stores
    wanted = save(donor, tmp_path, 20, "donor")
    elsewhere = LocalObjectStore(parse_uri(str(tmp_path / "runs" / "recipient")))
    copied = start_from(elsewhere, str(donor.uri.join("checkpoint-20")), ATTEMPT, scratch=tmp_path)
    assert copied is not None
    [info] = complete_checkpoints(elsewhere)
    local = download_checkpoint(elsewhere, info, tmp_path / "read")
    assert {name: (local / name).read_bytes() for name in wanted} == wanted
    assert not list(tmp_path.glob("spotray-start-from-*")), "its scratch copy is gone"
