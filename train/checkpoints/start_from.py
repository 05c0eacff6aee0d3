"""``spec.checkpoint.startFrom``: start a run from another run's checkpoint, copied into its own prefix.

Population-based training's exploit (docs/sweeps.md) and a warm start both need a run to go on from
a checkpoint it did not write. The copy is the job's, at the start of an attempt, with the
credentials and the checkpoint key it has anyway (the controller reads no checkpoint and no Secret).
Nothing of the run's own is deleted before its replacement is safe in the run's own prefix:

1. ``_spotray/<run id>/start-from.json`` names the URI already copied: the same URI again is done
   (later attempts resume from the run's own newest checkpoint, trained since).
2. The source: ``checkpoint-<step>`` if it is complete, else (pruned since it was named, or replaced by
   the source trial's own exploit) the source run's newest complete checkpoint after it, or failing that
   its newest; none at all is bad input, with the fix. Its manifest is checked with this run's key, as
   any checkpoint this run resumes from (with keys on, the runs of a namespace share one).
3. Staged: the source's files copied under ``_spotray/<run id>/start-from/<URI's hash>/checkpoint-<step>``,
   manifest last, signed with this run's key, its resume state (data position, RNG) kept: inside S3
   (CopyObject) when both are in one S3 endpoint under the same credentials; else downloaded, verified
   against the manifest, and uploaded. A source checkpoint pruned while it is copied (its manifest gone)
   is not bad input: the source run's next one is taken instead, up to ``SOURCE_TRIES`` times.
4. Swapped: this run's own checkpoints are deleted (each manifest first) and the staged copy copied to
   ``checkpoint-<step>``, manifest last. A crash here leaves the staged copy, which the next try takes
   without going back to the source (which may have pruned it since).
5. The record is written, then the staged copy deleted. A crash anywhere before the record repeats
   the copy from the last safe point, never half of it: a copy cut short has no manifest.

The attempt must hold the fence first (train/launch/launcher.py): older attempts of this run stop
uploading and pruning before their checkpoints are replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from spotray.contract.attempts import RECORDS_PREFIX, AttemptId
from spotray.contract.errors import Cause, CorruptCheckpointError, SpotrayError, StoreRequestError
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    VERIFIED_NAME,
    CheckpointInfo,
    delete_checkpoint,
    download_checkpoint,
    list_checkpoints,
    manifest_exists,
    manifest_json,
    parse_checkpoint_step,
    upload_checkpoint,
)
from spotray.train.records.attempt_records import check_fence, read_run_record, write_record
from spotray.train.storage.store import ObjectStore, S3ObjectStore, open_store, under

log = logging.getLogger(__name__)

# How many source checkpoints in a row may be pruned while being copied before the attempt gives up
# (infrastructure: the next attempt tries again). A donor with keep=1 saving every few seconds.
SOURCE_TRIES = 5


class SourcePrunedError(SpotrayError):
    """The source run pruned every checkpoint this run tried to copy, while it copied it."""

    cause = Cause.INFRASTRUCTURE


def start_from_key(run_id: str) -> str:
    return f"{RECORDS_PREFIX}/{run_id}/start-from.json"


def staging_prefix(run_id: str, uri: str) -> str:
    """Where the copy of ``uri`` is staged in the run's own prefix, apart from its checkpoints."""
    return f"{RECORDS_PREFIX}/{run_id}/start-from/{hashlib.sha256(uri.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class StartedFrom:
    """What a copy did: the source it named, the step copied, and how many own checkpoints it replaced."""

    uri: str
    step: int
    replaced: int


def copied_already(store: ObjectStore, run_id: str, uri: str) -> bool:
    """Whether this run's record says ``uri`` was copied (a record of another run, or unreadable, says no)."""
    record = read_run_record(store, start_from_key(run_id), run_id)
    return record is not None and record.get("uri") == uri


def source_checkpoint(source: ObjectStore, step: int, uri: str) -> CheckpointInfo:
    """``checkpoint-<step>`` of the source run when complete; else (pruned, or replaced by the source's own
    exploit since it was named) its newest complete one after it, or failing that its newest; none at all is
    bad input."""
    complete = [info for info in list_checkpoints(source) if info.complete]  # newest first
    exact = [info for info in complete if info.step == step]
    if exact:
        return exact[0]
    if complete:
        later = [info for info in complete if info.step > step]
        chosen = later[0] if later else complete[0]
        log.warning("%s is gone or incomplete: starting from %s instead", uri, source.uri.join(chosen.prefix))
        return chosen
    raise SpotrayError(
        f"checkpoint.startFrom {uri}: the run there has no complete checkpoint; one signed with another "
        "key than this run's counts as incomplete here",
        "name a complete checkpoint of the source run (`spotray checkpoints` lists them), made with the same "
        "checkpoint key as this run (with keys on, any run of the namespace unless spec.checkpoint.keySecret "
        "names another), or remove startFrom",
    )


def start_from(store: ObjectStore, uri: str, attempt: AttemptId, scratch: Path | None = None) -> StartedFrom | None:
    """Copy the checkpoint ``uri`` names into ``store`` in place of the run's own; None when done already."""
    if copied_already(store, attempt.run_id, uri):
        return None
    parsed = parse_uri(uri)
    parent, _, name = parsed.prefix.rpartition("/")
    step = parse_checkpoint_step(name)
    if step is None:  # the spec's parser refuses such a URI; a job started by hand may not have used it
        raise SpotrayError(f"checkpoint.startFrom {uri}: not a checkpoint-<step> directory", "name one")
    staged = under(store, staging_prefix(attempt.run_id, uri))
    chosen = _staged_copy(staged)
    if chosen is None:
        source = open_store(type(parsed)(parsed.scheme, parsed.bucket, parent), checkpoint_key=store.checkpoint_key)
        check_fence(store, attempt)
        chosen = _stage(source, staged, step, uri, scratch)
    else:
        log.info("taking the copy staged by an earlier try: %s", staged.uri.join(chosen.prefix))
    own = list_checkpoints(store)
    check_fence(store, attempt)
    for info in own:  # only now: the replacement is complete in the run's own prefix
        delete_checkpoint(store, info)
    _copy(staged, store, chosen, attempt, scratch)
    write_record(store, start_from_key(attempt.run_id), attempt, {"uri": uri, "step": chosen.step})
    _empty(staged)
    log.info("started from %s: checkpoint-%d copied, %d checkpoint(s) of this run replaced", uri, chosen.step, len(own))
    return StartedFrom(uri, chosen.step, len(own))


def _empty(staged: ObjectStore) -> None:
    """Delete whatever is staged: a copy cut short, or one that has served."""
    staged.delete([o.key for o in staged.list()])


def _staged_copy(staged: ObjectStore) -> CheckpointInfo | None:
    """A complete copy an earlier try staged (signed with this run's key), or None."""
    return next((info for info in list_checkpoints(staged) if info.complete), None)


def _stage(source: ObjectStore, staged: ObjectStore, step: int, uri: str, scratch: Path | None) -> CheckpointInfo:
    """Copy the source's checkpoint into ``staged``; one pruned meanwhile gives way to the source's next."""
    for _ in range(SOURCE_TRIES):
        chosen = source_checkpoint(source, step, uri)
        try:
            _copy(source, staged, chosen, None, scratch)
        except (StoreRequestError, FileNotFoundError, CorruptCheckpointError):
            if manifest_exists(source, chosen.prefix):
                raise  # still there: the fault is not a prune
            log.warning(
                "%s was pruned while being copied: taking the source run's next", source.uri.join(chosen.prefix)
            )
            _empty(staged)
            continue
        return chosen
    raise SourcePrunedError(
        f"checkpoint.startFrom {uri}: the source run pruned {SOURCE_TRIES} checkpoints in a row while they were copied",
        "nothing to do: the next attempt tries again; a source run that keeps more checkpoints (keep) or saves "
        "less often gives the copy more time",
    )


def _copy(
    source: ObjectStore, target: ObjectStore, chosen: CheckpointInfo, attempt: AttemptId | None, scratch: Path | None
) -> None:
    """``chosen`` of ``source`` as ``target``'s checkpoint of that step, manifest last, signed with ``target``'s
    key: inside S3 when one endpoint and credentials hold both, else through this machine."""
    if isinstance(target, S3ObjectStore) and target.shares_credentials(source):
        assert isinstance(source, S3ObjectStore)
        _copy_in_s3(source, target, chosen, attempt)
    else:
        _download_and_upload(source, target, chosen, attempt, scratch)


def _copy_in_s3(source: S3ObjectStore, store: S3ObjectStore, chosen: CheckpointInfo, attempt: AttemptId | None) -> None:
    """The copy inside S3 (CopyObject): the source's files under the same names, then its manifest, re-signed
    with this run's key. No byte passes through this machine; the attempt that resumes from the copy hashes
    every byte against the manifest as it downloads (train/checkpoints/resume.py), as for any checkpoint."""
    manifest = chosen.manifest
    assert manifest is not None
    store.copy_in(source, [(f"{chosen.prefix}/{name}",) * 2 for name in manifest.files])
    copied = dataclasses.replace(manifest, created_at=time.time())
    if attempt is not None:
        check_fence(store, attempt)  # the commit, as upload_checkpoint makes it
    store.put_bytes(f"{chosen.prefix}/{MANIFEST_NAME}", manifest_json(copied, store.checkpoint_key))


def _download_and_upload(
    source: ObjectStore, store: ObjectStore, chosen: CheckpointInfo, attempt: AttemptId | None, scratch: Path | None
) -> None:
    """The copy through this machine (another store, or other credentials): downloaded and verified against
    the source's manifest, then uploaded as any checkpoint is, manifest last."""
    manifest = chosen.manifest
    assert manifest is not None
    work = Path(tempfile.mkdtemp(prefix="spotray-start-from-", dir=scratch))
    try:
        local = download_checkpoint(source, chosen, work)
        (local / VERIFIED_NAME).unlink(missing_ok=True)  # this node's note, not a file of the checkpoint
        upload_checkpoint(store, local, chosen.step, manifest.world_size, manifest.resume, attempt=attempt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
