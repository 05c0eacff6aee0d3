"""The checkpoint layout in a store, and the one definition of a *complete* checkpoint.

Layout under a run's checkpoint URI::

    checkpoint-<step>/<files written by the trainer>
    checkpoint-<step>/spotray-manifest.json      <- written LAST
    _spotray/...                                 <- the attempts' records (spotray/contract/attempts.py)

The manifest lists every file with its size and SHA-256, plus the step, world size, library
versions and what resume needs. A checkpoint is complete when its manifest parses and every file it
lists is present with the listed size; its checksums are verified when it is downloaded. Because the
manifest goes up last and comes down first on deletion, a checkpoint cut off at any moment, while
being written or while being pruned, is never taken for complete. Where the store has the run's
checkpoint key (spotray/contract/checkpoint_key.py), the manifest is signed with it, and one that
is not signed with it is not complete either: a writer of the bucket cannot forge what is loaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.contract.bounded_json import bounds_problem, count, load_json, unix_time
from spotray.contract.checkpoint_key import SIGNATURE_FIELD, CheckpointKey
from spotray.contract.errors import (
    CorruptCheckpointError,
    ForeignCheckpointError,
    ObjectTooLargeError,
    SpotrayError,
    StoreRequestError,
)
from spotray.train.records.attempt_records import check_fence
from spotray.train.storage.store import ObjectInfo, ObjectStore, object_exists, upload_dir

log = logging.getLogger(__name__)

MANIFEST_NAME = "spotray-manifest.json"
MANIFEST_FORMAT = 1
CHECKPOINT_DIR_PATTERN = re.compile(r"^checkpoint-(\d+)$")
# Normal while an upload is in flight, so it is not worth a warning; every other problem is.
NO_MANIFEST = "no manifest (upload unfinished or interrupted)"
# Listed, then gone before it could be read: pruned or replaced meanwhile (by another attempt, or the controller
# reading while the job prunes). As normal as NO_MANIFEST: the checkpoint is simply not there any more.
VANISHED = "deleted while being read (pruned or replaced meanwhile)"
# The bounds of a manifest (spotray/contract/bounded_json.py): the controller reads the newest one
# of every running run, from a bucket the run's owner can write. A file takes about 130 bytes and
# its name's, and 6 values: room for about 9,000 files (the shards and RNG states of 3,000 ranks).
# A checkpoint with more is refused when it is saved (``manifest_json``), never written unreadable.
# A read of a manifest at these bounds stays within the 16 MiB budget of tests/unit/test_read_memory.py;
# the 16 MiB bound they replaced let one hostile manifest take 420 MiB of the controller's 512 MiB.
MAX_MANIFEST_BYTES = 1536 << 10
MAX_MANIFEST_VALUES = 64_000
_VERSIONED_PACKAGES = ("torch", "transformers", "ray", "mosaicml-streaming", "spotray")
# What a manifest's HMAC is for (spotray/contract/checkpoint_key.py).
MANIFEST_PURPOSE = "checkpoint manifest"


def checkpoint_dir_name(step: int) -> str:
    return f"checkpoint-{step}"


def parse_checkpoint_step(name: str) -> int | None:
    match = CHECKPOINT_DIR_PATTERN.match(name)
    return int(match.group(1)) if match else None


# ----------------------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint holds and what resuming from it needs."""

    step: int
    world_size: int
    files: dict[str, FileEntry]
    created_at: float
    versions: dict[str, str] = field(default_factory=dict)
    resume: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT
    # Whether the manifest as read carried an HMAC (checked against the key the reader had, if any).
    signed: bool = field(default=False, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self, key: CheckpointKey | None = None) -> bytes:
        """The manifest as stored: signed with ``key`` when there is one."""
        content = asdict(self)
        del content["signed"]
        signed = key.sign(MANIFEST_PURPOSE, content) if key is not None else content
        return json.dumps(signed, indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str, key: CheckpointKey | None = None) -> Manifest:
        """Parse a manifest; anything malformed, or not signed with ``key`` when there is one, raises
        ``CorruptCheckpointError`` naming ``where``."""
        try:
            raw = load_json(data, max_bytes=MAX_MANIFEST_BYTES, max_values=MAX_MANIFEST_VALUES)
            if not isinstance(raw, dict):
                raise TypeError("top level is not an object")
            if raw.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown manifest format {raw.get('format')!r}")
            forged = key.problem(MANIFEST_PURPOSE, raw) if key is not None else None
            if forged is not None:  # before any of its content is taken for what it says
                raise ForeignCheckpointError(
                    f"the manifest {where} {forged}",
                    "give the run the key that signed it (spec.checkpoint.keySecret; SPOTRAY_CHECKPOINT_KEY in "
                    "local mode), or a checkpoint URI of its own; if nobody you trust wrote it, delete it",
                )
            files = {
                str(name): FileEntry(size=count(entry["size"], f"{name}'s size"), sha256=str(entry["sha256"]))
                for name, entry in raw["files"].items()
            }
            for name in files:
                check_file_name(name, f"the manifest {where}")
            return cls(
                step=count(raw["step"], "step"),
                world_size=count(raw["world_size"], "world_size", minimum=1),
                files=files,
                created_at=unix_time(raw["created_at"], "created_at"),
                versions={str(k): str(v) for k, v in raw.get("versions", {}).items()},
                resume=dict(raw.get("resume", {})),
                signed=SIGNATURE_FIELD in raw,
            )
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as error:
            raise CorruptCheckpointError(
                f"the manifest {where} is corrupt ({type(error).__name__}: {error})",
                "nothing to do: this checkpoint is skipped and an older complete one is used; "
                "delete it to silence this warning",
            ) from error


def manifest_json(manifest: Manifest, key: CheckpointKey | None) -> bytes:
    """The manifest as uploaded (signed with ``key`` when there is one); SpotrayError (bad input: every
    save would fail the same way) when it is past the bounds its readers keep, which would leave the
    checkpoint complete to no one."""
    data = manifest.to_json(key)
    problem = bounds_problem(data, max_bytes=MAX_MANIFEST_BYTES, max_values=MAX_MANIFEST_VALUES)
    if problem is not None:
        raise SpotrayError(
            f"checkpoint-{manifest.step} has {len(manifest.files)} files, too many for its manifest: {problem}",
            "save the checkpoint in fewer, larger files (a manifest lists about 9,000 at most): "
            "fewer shards, or the optimizer state in one file per rank",
        )
    return data


def check_file_name(name: str, where: str) -> None:
    """Refuse a listed file that would land outside the checkpoint's directory when downloaded.

    Anyone who can write to the bucket can write a manifest; downloads join its names to a local
    directory, so only plain relative paths (no ``..``, ``.``, empty parts, leading ``/``,
    backslashes or NUL) are accepted, and the manifest's own name is reserved.
    """
    parts = name.split("/")
    plain = all(part not in ("", ".", "..") for part in parts) and "\\" not in name and "\0" not in name
    if not plain or name == MANIFEST_NAME:
        raise CorruptCheckpointError(
            f"{where} names {name!r}, a path outside its checkpoint or not in plain relative form",
            "spotray never writes such a name: check who can write to the bucket, and delete this checkpoint",
        )


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (the same bytes, none copied), or a copy across filesystems;
    whatever was at ``target`` is replaced. A link is never written through: its readers only read."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def installed_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def build_manifest(local_dir: Path, step: int, world_size: int, resume: dict[str, Any] | None = None) -> Manifest:
    """Describe the files under ``local_dir`` (sizes and SHA-256) for checkpoint ``step``."""
    files = {
        path.relative_to(local_dir).as_posix(): FileEntry(path.stat().st_size, file_sha256(path))
        for path in sorted(local_dir.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }
    return Manifest(
        step=step,
        world_size=world_size,
        files=files,
        created_at=time.time(),
        versions=installed_versions(),
        resume=resume or {},
    )


def verify_local_checkpoint(local_dir: Path, manifest: Manifest, digests: Mapping[str, str] | None = None) -> None:
    """Raise ``CorruptCheckpointError`` unless every listed file has the listed size and checksum.

    ``digests`` (file name to SHA-256) are checksums already computed as the files were written (a
    download hashes as the bytes arrive); only files without one are read and hashed here.
    """
    known = digests or {}
    for name, entry in manifest.files.items():
        path = local_dir / name
        problem = None
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != entry.size:
            problem = f"has {path.stat().st_size} bytes, the manifest says {entry.size}"
        elif (known.get(name) or file_sha256(path)) != entry.sha256:
            problem = "does not match its SHA-256 in the manifest"
        if problem:
            raise CorruptCheckpointError(
                f"checkpoint-{manifest.step}: file {name} {problem}",
                "nothing to do: an older complete checkpoint is used instead; delete this one if it persists",
            )


# A local copy verified against its manifest records each file's size and modification time here, so
# that a worker restarted on the same node reuses it without reading every byte again. Written last
# (before the copy's directory is renamed into place), like the manifest in the store.
VERIFIED_NAME = "spotray-verified.json"


def _record_verified(local_dir: Path, manifest: Manifest) -> None:
    files = {}
    for name, entry in manifest.files.items():
        stat = (local_dir / name).stat()
        files[name] = {"sha256": entry.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    (local_dir / VERIFIED_NAME).write_text(json.dumps({"step": manifest.step, "files": files}, sort_keys=True))


def verified_copy_unchanged(local_dir: Path, manifest: Manifest) -> bool:
    """Whether ``local_dir`` holds a copy verified against these same checksums, untouched since.

    Untouched means the size and modification time of every file are what they were when its bytes
    were hashed. Anything else (no record, another checkpoint's, a file rewritten) is not a match,
    and the caller hashes the files again.
    """
    try:
        record = json.loads((local_dir / VERIFIED_NAME).read_text())
        recorded = record["files"]
        if record["step"] != manifest.step or set(recorded) != set(manifest.files):
            return False
        for name, entry in manifest.files.items():
            stat = (local_dir / name).stat()
            seen = recorded[name]
            if (seen["sha256"], seen["size"], seen["mtime_ns"]) != (entry.sha256, stat.st_size, stat.st_mtime_ns):
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


# ------------------------------------------------------------------------------- listing and choice


@dataclass(frozen=True)
class CheckpointInfo:
    """One ``checkpoint-<step>/`` in the store; ``problem`` is None exactly when it is complete."""

    step: int
    prefix: str
    size_bytes: int
    manifest: Manifest | None
    problem: str | None
    file_count: int = 0  # objects under the prefix, the manifest included
    # Its manifest is whole but not signed with the reader's key (``ForeignCheckpointError``): another
    # key's run wrote it, or a forger. Not this run's to load, prune or write over.
    foreign: bool = False

    @property
    def complete(self) -> bool:
        return self.problem is None


def _assess(store: ObjectStore, step: int, objects: list[ObjectInfo]) -> CheckpointInfo:  # noqa: PLR0911 - one per verdict
    prefix = checkpoint_dir_name(step)
    sizes = {o.key[len(prefix) + 1 :]: o.size for o in objects}
    found = partial(CheckpointInfo, step, prefix, sum(sizes.values()), file_count=len(sizes))
    if MANIFEST_NAME not in sizes:
        return found(None, NO_MANIFEST)
    where = str(store.uri.join(prefix, MANIFEST_NAME))
    try:
        raw_manifest = store.get_bytes(f"{prefix}/{MANIFEST_NAME}", max_bytes=MAX_MANIFEST_BYTES)
        manifest = Manifest.from_json(raw_manifest, where, store.checkpoint_key)
    except ForeignCheckpointError as error:
        return found(None, error.problem, foreign=True)
    except (CorruptCheckpointError, ObjectTooLargeError) as error:
        return found(None, error.problem)
    except (StoreRequestError, FileNotFoundError):
        if not manifest_exists(store, prefix):
            return found(None, VANISHED)
        raise
    if manifest.step != step:
        return found(manifest, f"manifest says step {manifest.step}, directory says {step}")
    for name, entry in manifest.files.items():
        if name not in sizes:
            return found(manifest, f"file {name} listed in the manifest is missing")
        if sizes[name] != entry.size:
            return found(manifest, f"file {name} has {sizes[name]} bytes, the manifest says {entry.size}")
    return found(manifest, None)


def manifest_exists(store: ObjectStore, prefix: str) -> bool:
    return object_exists(store, f"{prefix}/{MANIFEST_NAME}")


def _assessed_newest_first(store: ObjectStore) -> Iterator[CheckpointInfo]:
    """Every checkpoint under the store's root, newest first, assessed (one manifest read) as it is reached."""
    by_step: dict[int, list[ObjectInfo]] = {}
    for obj in store.list("checkpoint-"):
        head, _, rest = obj.key.partition("/")
        step = parse_checkpoint_step(head)
        if step is not None and rest:
            by_step.setdefault(step, []).append(obj)
    for step in sorted(by_step, reverse=True):
        yield _assess(store, step, by_step[step])


def list_checkpoints(store: ObjectStore) -> list[CheckpointInfo]:
    """Every checkpoint under the store's root, newest first, each marked complete or not (and why)."""
    return list(_assessed_newest_first(store))


def _complete_newest_first(store: ObjectStore) -> Iterator[CheckpointInfo]:
    for info in _assessed_newest_first(store):
        if info.complete:
            yield info
        else:
            log_incomplete(store, [info])


def log_incomplete(store: ObjectStore, checkpoints: list[CheckpointInfo]) -> None:
    """Say why each incomplete checkpoint is skipped: a warning, unless it is an upload in flight or gone."""
    for info in checkpoints:
        if info.complete:
            continue
        if info.problem in (NO_MANIFEST, VANISHED):
            log.info("skipping %s: %s", store.uri.join(info.prefix), info.problem)
        else:
            log.warning("skipping %s: %s", store.uri.join(info.prefix), info.problem)


def complete_checkpoints(store: ObjectStore) -> list[CheckpointInfo]:
    """Complete checkpoints, newest first; each incomplete one is logged with its reason."""
    return list(_complete_newest_first(store))


def latest_complete_checkpoint(store: ObjectStore) -> CheckpointInfo | None:
    """The newest complete checkpoint, or None when there is none (a fresh start).

    Older checkpoints are not assessed: one LIST and one manifest read when the newest is complete
    (the controller asks this of every running run at every refresh).
    """
    return next(_complete_newest_first(store), None)


# --------------------------------------------------------------------------- upload, fetch, prune


def delete_checkpoint(store: ObjectStore, info: CheckpointInfo, objects: list[ObjectInfo] | None = None) -> None:
    """Delete the manifest first, so that a deletion cut short leaves an incomplete checkpoint."""
    keys = [o.key for o in (objects if objects is not None else store.list(info.prefix + "/"))]
    manifest_key = f"{info.prefix}/{MANIFEST_NAME}"
    if manifest_key in keys:
        store.delete([manifest_key])
    store.delete([k for k in keys if k != manifest_key])


def upload_checkpoint(
    store: ObjectStore,
    local_dir: Path,
    step: int,
    world_size: int,
    resume: dict[str, Any] | None = None,
    *,
    attempt: AttemptId | None = None,
) -> Manifest:
    """Upload ``local_dir`` as ``checkpoint-<step>/``: drop any old manifest, send files, manifest last.

    With ``attempt``, the fence is checked before the first write and again before the manifest
    (the commit): a superseded attempt raises ``SupersededError`` and never completes a checkpoint.
    """
    if attempt is not None:
        check_fence(store, attempt)
    prefix = checkpoint_dir_name(step)
    existing = store.list(prefix + "/")
    if existing:
        # A checkpoint of this step from an earlier attempt: retract it before replacing its files.
        delete_checkpoint(store, CheckpointInfo(step, prefix, 0, None, "replaced"), existing)
    manifest = build_manifest(local_dir, step, world_size, resume)
    committed = manifest_json(manifest, store.checkpoint_key)  # refused before any file goes up
    upload_dir(store, local_dir, prefix, exclude={MANIFEST_NAME})
    if attempt is not None:
        check_fence(store, attempt)
    store.put_bytes(f"{prefix}/{MANIFEST_NAME}", committed)
    return manifest


def download_checkpoint(store: ObjectStore, info: CheckpointInfo, dest_root: Path) -> Path:
    """Fetch a complete checkpoint into ``dest_root/checkpoint-<step>`` and verify every checksum.

    ``dest_root`` is one per node: the processes of a node that resume from the same checkpoint take
    turns (a file lock), so the first downloads it and the others reuse its copy. A copy that was
    verified and is unchanged since (``verified_copy_unchanged``) is reused without reading it again;
    any other copy there is hashed again, and replaced if it does not match. The download lands in
    a temporary directory, hashed as its bytes arrive, and is renamed into place only once verified.
    """
    if info.manifest is None:
        raise CorruptCheckpointError(f"{info.prefix} has no manifest", "choose a complete checkpoint")
    manifest = info.manifest
    final = dest_root / info.prefix
    dest_root.mkdir(parents=True, exist_ok=True)
    with _locked(dest_root / ".spotray-download.lock"):
        if final.is_dir():
            if verified_copy_unchanged(final, manifest):
                return final
            try:
                verify_local_checkpoint(final, manifest)
                _record_verified(final, manifest)
                return final
            except CorruptCheckpointError:
                shutil.rmtree(final)
        partial = partial_copy_dir(dest_root, info)
        shutil.rmtree(partial, ignore_errors=True)
        names = list(manifest.files)
        try:
            digests = store.download_files([(f"{info.prefix}/{name}", partial / name) for name in names])
            verify_local_checkpoint(partial, manifest, {name: digests[partial / name] for name in names})
        except Exception:
            shutil.rmtree(partial, ignore_errors=True)  # the node's disk is not left holding a copy nobody uses
            raise
        _put_in_place(partial, final, manifest)
    return final


def partial_copy_dir(dest_root: Path, info: CheckpointInfo) -> Path:
    """Where a node's copy of ``info`` is assembled before it is verified and renamed into place."""
    return dest_root / f".{info.prefix}.partial"


def install_copy(dest_root: Path, info: CheckpointInfo, partial: Path, digests: Mapping[str, str]) -> Path:
    """Verify a copy assembled in ``partial`` outside ``download_checkpoint`` (train/checkpoints/shared_read.py)
    and rename it into place; ``digests`` are the SHA-256 computed as its files were written. Raises
    ``CorruptCheckpointError`` (the copy left for the next fetch to replace) when it does not verify."""
    if info.manifest is None:
        raise CorruptCheckpointError(f"{info.prefix} has no manifest", "choose a complete checkpoint")
    verify_local_checkpoint(partial, info.manifest, digests)
    final = dest_root / info.prefix
    with _locked(dest_root / ".spotray-download.lock"):
        shutil.rmtree(final, ignore_errors=True)  # a copy that did not verify: download_checkpoint would replace it too
        _put_in_place(partial, final, info.manifest)
    return final


def _put_in_place(partial: Path, final: Path, manifest: Manifest) -> None:
    """The manifest and the verified record last, then the rename: a copy in place is a verified one."""
    (partial / MANIFEST_NAME).write_bytes(manifest.to_json())
    _record_verified(partial, manifest)
    partial.rename(final)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock on ``lock_path`` between processes of one node (released if the holder dies)."""
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def delete_other_copies(dest_root: Path, step: int) -> list[Path]:
    """Delete the local copies (and leftover partial downloads) in ``dest_root`` of checkpoints other
    than ``step``: a node keeps the one it resumed from. Only once no process there uses them."""
    deleted = []
    for path in sorted(dest_root.iterdir()) if dest_root.is_dir() else []:
        name = path.name.removeprefix(".").removesuffix(".partial")
        if path.is_dir() and parse_checkpoint_step(name) not in (None, step):
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


def prune_checkpoints(
    store: ObjectStore, keep: int, *, attempt: AttemptId | None = None, just_uploaded: int | None = None
) -> list[int]:
    """Keep the newest ``keep`` complete checkpoints; delete older ones. Returns the steps deleted.

    Incomplete checkpoints older than the newest complete one are abandoned uploads and go too;
    anything newer than the newest complete one may be an upload in flight and is left alone, and a
    foreign one (signed with another key, or unsigned where the run signs) is never this run's to delete.
    Never deleted, whatever ``keep`` says: ``just_uploaded`` (its bytes were hashed from the local
    files a moment ago, while a newer-numbered checkpoint may be complete by its sizes and still
    corrupt) and the step the running attempt resumed from (the fence's ``resumed_from``). With
    ``attempt``, a superseded attempt raises ``SupersededError`` and deletes nothing.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1: pruning must never delete the last complete checkpoint")
    fence = check_fence(store, attempt) if attempt is not None else None
    protected = {just_uploaded, fence.resumed_from if fence else None} - {None}
    checkpoints = list_checkpoints(store)
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    newest_complete = complete[0].step
    # A foreign checkpoint is another key's (controller/checkpoint_key_secret.py): never this run's to delete.
    abandoned = [c for c in checkpoints if not c.complete and not c.foreign and c.step < newest_complete]
    doomed = complete[keep:] + abandoned
    doomed = [c for c in doomed if c.step not in protected]
    for info in sorted(doomed, key=lambda c: c.step):
        if attempt is not None:
            check_fence(store, attempt)  # again before each deletion: the fence may have moved meanwhile
        delete_checkpoint(store, info)
        log.info("pruned %s", store.uri.join(info.prefix))
    return sorted(c.step for c in doomed)
