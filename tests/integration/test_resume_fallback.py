"""Resume falls back (issue #36) against a real SeaweedFS: a checkpoint that lists as complete but
cannot be fetched is skipped with a warning naming it and the older one is used, on every rank; a
store that stops answering (or refuses the credentials) still ends the attempt; a fence another run
left under the checkpoint URI does not stop this run, while a newer attempt of this run still does."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import (
    Cause,
    StoreCredentialsError,
    StoreUnreachableError,
    cause_of,
)
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints import resume as resume_module
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    complete_checkpoints,
    latest_complete_checkpoint,
    prune_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.resume import ResumeFetch, fetch_resume_checkpoint
from spotray.train.records.attempt_records import SupersededError, read_fence, write_fence
from spotray.train.storage.local_s3 import LocalS3Server, free_port
from spotray.train.storage.store import ObjectInfo, RetryPolicy, S3ObjectStore, StoreConfig
from tests.conftest import write_files

pytestmark = pytest.mark.integration


def upload(store: S3ObjectStore, tmp_path: Path, step: int, attempt: AttemptId | None = None) -> None:
    files = {"model.bin": bytes([step % 256]) * 4096, "trainer_state.json": b'{"global_step": %d}' % step}
    upload_checkpoint(store, write_files(tmp_path / f"src-{step}", files), step, 1, attempt=attempt)


def plant(store: S3ObjectStore, step: int, files: dict[str, bytes]) -> None:
    """Objects and a manifest that matches them, in the manifest in ``files``' order (the download's)."""
    listed = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    for name, data in files.items():
        store.put_bytes(f"checkpoint-{step}/{name}", data)
    manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": 1, "files": listed, "created_at": time.time()}
    store.put_bytes(f"checkpoint-{step}/{MANIFEST_NAME}", json.dumps(manifest).encode())


# S3 keeps both keys; a file system cannot have x/y as a file and as a directory.
@pytest.mark.parametrize("names", [["x/y", "x/y/z"], ["x/y/z", "x/y"]], ids=["file-first", "directory-first"])
def test_a_checkpoint_whose_keys_cannot_be_local_files_is_skipped_for_the_older_one(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, names: list[str]
) -> None:
    upload(s3_store, tmp_path, 10)
    plant(s3_store, 20, {name: name.encode() for name in names})
    newest = latest_complete_checkpoint(s3_store)
    assert newest is not None
    assert newest.step == 20, "it lists as complete: only the download can tell"

    dest = tmp_path / "resume"
    point = fetch_resume_checkpoint(s3_store, dest)
    assert point is not None
    assert point.step == 10
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING" and "checkpoint-20" in r.getMessage()]
    assert f"skipping {s3_store.uri.join('checkpoint-20')}: " in warning.getMessage()
    assert "cannot be files" in warning.getMessage()
    assert sorted(p.name for p in dest.iterdir() if "checkpoint" in p.name) == ["checkpoint-10"], (
        "the failed download left its partial copy"
    )


class ObjectGoneAfterListing:
    """The real store, except that ``checkpoint-20/model.bin`` is deleted right after the LIST that
    assessed the checkpoints: listed complete, one object gone by the download, the manifest still there."""

    def __init__(self, inner: S3ObjectStore) -> None:
        self.inner = inner

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        listed = self.inner.list(prefix)
        if prefix == "checkpoint-":
            self.inner.delete(["checkpoint-20/model.bin"])
        return listed

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_an_object_the_manifest_lists_that_is_gone_is_skipped_for_the_older_one(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (10, 20):
        upload(s3_store, tmp_path, step)
    point = fetch_resume_checkpoint(ObjectGoneAfterListing(s3_store), tmp_path / "resume")  # type: ignore[arg-type]
    assert point is not None
    assert point.step == 10
    assert f"skipping {s3_store.uri.join('checkpoint-20')}: " in caplog.text
    assert "NoSuchKey" in caplog.text


class DownloadsElsewhere:
    """Lists and reads manifests from the real store, downloads through ``downloads``: a store that
    fails (stops answering, refuses the key) between the choice of a checkpoint and its download."""

    def __init__(self, inner: S3ObjectStore, downloads: S3ObjectStore) -> None:
        self.inner, self.downloads = inner, downloads

    def download_files(self, pairs: list[tuple[str, Path]]) -> dict[Path, str]:
        return self.downloads.download_files(pairs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_store_that_stops_answering_during_the_download_still_raises(s3_store: S3ObjectStore, tmp_path: Path) -> None:
    """Not the checkpoint's fault: skipping would resume from an older step (or afresh) for an outage."""
    for step in (10, 20):
        upload(s3_store, tmp_path, step)
    config = StoreConfig(endpoint_url=f"http://127.0.0.1:{free_port()}", access_key_id="a", secret_access_key="b")
    gone = S3ObjectStore(s3_store.uri, config, RetryPolicy(deadline_s=1.0))
    with pytest.raises(StoreUnreachableError):
        fetch_resume_checkpoint(DownloadsElsewhere(s3_store, gone), tmp_path / "resume")  # type: ignore[arg-type]


def test_credentials_refused_during_the_download_still_raise(
    s3_store: S3ObjectStore, s3_server: LocalS3Server, tmp_path: Path
) -> None:
    for step in (10, 20):
        upload(s3_store, tmp_path, step)
    revoked = StoreConfig(
        endpoint_url=s3_server.config.endpoint_url, access_key_id="revoked-key", secret_access_key="wrong"
    )
    refused = S3ObjectStore(parse_uri(str(s3_store.uri)), revoked, RetryPolicy(deadline_s=5))
    with pytest.raises(StoreCredentialsError):
        fetch_resume_checkpoint(DownloadsElsewhere(s3_store, refused), tmp_path / "resume")  # type: ignore[arg-type]


def test_a_rank_whose_bet_hit_such_a_checkpoint_ends_on_rank_0s_choice(
    s3_store: S3ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 bets on the newest complete checkpoint (its keys cannot be files) and rank 0 chose the older
    one: rank 1 takes that one. The collective is stubbed (rank 0's choice, as the broadcast would bring
    it); test_resume_fetch.py runs the real one under torchrun."""
    upload(s3_store, tmp_path, 10)
    plant(s3_store, 20, {"x/y": b"file", "x/y/z": b"under the file"})
    monkeypatch.setattr(resume_module, "world_rank", lambda: 1)
    monkeypatch.setattr(resume_module, "broadcast_from_rank0", lambda _: 10)
    monkeypatch.setattr(resume_module, "barrier", lambda: None)
    point = ResumeFetch(s3_store, tmp_path / "node-1").wait()
    assert point is not None
    assert point.step == 10
    assert (point.local_dir / "model.bin").read_bytes() == bytes([10]) * 4096


def test_a_fence_another_run_left_does_not_stop_this_run_but_a_newer_attempt_of_it_does(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another run given the same URI left its fence: this run's attempt uploads and prunes (it takes the
    fence over, warning with the other run's name). Then this run's next attempt claims the URI: the older
    attempt is superseded, an infrastructure fault, and completes nothing more."""
    this, newer = AttemptId("this-run", 1), AttemptId("this-run", 2)
    write_fence(s3_store, AttemptId("other-run", 4), resumed_from=70)
    upload(s3_store, tmp_path, 10, attempt=this)
    upload(s3_store, tmp_path, 20, attempt=this)
    assert prune_checkpoints(s3_store, keep=1, attempt=this, just_uploaded=20) == [10]
    fence = read_fence(s3_store)
    assert fence is not None
    assert fence.holds(this)
    assert "other-run" in caplog.text

    write_fence(s3_store, newer)
    with pytest.raises(SupersededError) as caught:
        upload(s3_store, tmp_path, 30, attempt=this)
    assert cause_of(caught.value) is Cause.INFRASTRUCTURE
    assert [c.step for c in complete_checkpoints(s3_store)] == [20]


def test_a_run_that_took_over_the_claim_of_a_run_that_still_runs_stops_as_bad_input(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Taking a fence over is for one left behind. When the run that claimed it still runs, it takes the
    fence back at its next check, and the run that took it over stops as bad input (give each run its
    own URI): the latest claim wins."""
    this, other = AttemptId("this-run", 1), AttemptId("other-run", 4)
    write_fence(s3_store, other)
    upload(s3_store, tmp_path, 10, attempt=this)  # takes the fence over
    upload(s3_store, tmp_path, 20, attempt=other)  # the other run still runs: it takes its claim back
    assert "takes back" in caplog.text
    with pytest.raises(SupersededError) as caught:
        upload(s3_store, tmp_path, 30, attempt=this)
    assert cause_of(caught.value) is Cause.BAD_INPUT
    assert "spec.checkpoint.uri" in caught.value.fix
    assert [c.step for c in complete_checkpoints(s3_store)] == [20, 10]
