"""A checkpoint whose upload never finished, completed in the store from the copies the nodes kept.

A save on several nodes is safe once it is in the store, and the upload takes time: at a real
bucket's 100-200 MB/s per node a multi-GB state takes a minute, longer than a spot notice on GKE
(about 15 s). When the attempt dies during that upload (the node reclaimed, the notice ended), the
store has part of the checkpoint and no manifest, and without this the run resumes from the
checkpoint before: every step since is trained again. But the nodes kept their files and sent them
to their ring neighbour while uploading (train/checkpoints/node_copies.py), each share with its
record (sizes, SHA-256, the save's id, node 0's data position). Where the nodes that come back hold
every share of that save, the next start completes it (issue 73, item 2):

1. Every rank says what its node keeps (``node_layout``: files and records). Rank 0 lists the store
   and ``plan_completion`` looks for the newest save that every share's record covers, whose files
   some node holds at their size, that is newer than the store's newest complete checkpoint and has
   no manifest there (a manifest, even one that does not verify, is never written over). Rank 0's
   plan goes to every rank: each file is uploaded by the lowest-numbered node that holds it.
2. Each node's first process hashes its files against the records and uploads them
   (``upload_from_copies``), in the background while the model is built.
3. When every node's upload succeeded, rank 0 checks the fence (a newer attempt stops this one), that
   every file is in the store at its size, and writes the manifest, signed with the run's key, from
   the records: the checkpoint is complete, and the resume reads it as any other.

Anything wrong (a record missing, a file that does not hash to its record, an upload failing) leaves
the checkpoint as it was, with a warning, and the resume goes on from the store's newest complete
one, as it would without copies. The records are what the run's own processes wrote on its own
pods, as trusted as the files they describe; the bytes are hashed again here before they are uploaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import CorruptCheckpointError
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    NO_MANIFEST,
    CheckpointInfo,
    FileEntry,
    Manifest,
    checkpoint_dir_name,
    file_sha256,
    installed_versions,
    manifest_json,
)
from spotray.train.checkpoints.node_copies import NodeCopies, ShareRecord
from spotray.train.checkpoints.node_parts import check_uploaded
from spotray.train.records.attempt_records import check_fence
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """A save the nodes hold whole and the store does not: its manifest's content, and who uploads what."""

    step: int
    world_size: int
    files: dict[str, FileEntry]
    resume: dict[str, Any]
    uploader_of: dict[str, int] = field(default_factory=dict)  # file -> the (current) node that uploads it

    def files_of(self, node: int) -> list[str]:
        return sorted(name for name, uploader in self.uploader_of.items() if uploader == node)


def plan_completion(
    records: Sequence[Sequence[ShareRecord]],
    held: Sequence[Mapping[int, Mapping[str, int]]],
    uri: str,
    listed: Sequence[CheckpointInfo],
) -> Completion | None:
    """The newest save the nodes can complete in the store (see the module's docstring), or None.

    ``records[k]`` and ``held[k]`` are what node k keeps (``NodeCopies.records`` and ``held``), by the
    current nodes' numbers; ``listed`` is the store's checkpoints (``list_checkpoints``)."""
    newest_complete = max((info.step for info in listed if info.complete), default=-1)
    with_manifest = {info.step for info in listed if info.problem != NO_MANIFEST}
    saves: dict[tuple[int, str], dict[int, ShareRecord]] = {}
    for record in (record for node_records in records for record in node_records):
        if record.uri == uri:
            saves.setdefault((record.step, record.save_id), {})[record.node] = record
    for (step, _), shares in sorted(saves.items(), reverse=True):
        if step <= newest_complete:
            break
        if step in with_manifest or not _whole_save(shares):
            continue
        files: dict[str, FileEntry] = {}
        for share in shares.values():
            files.update(share.files)
        holders = {
            name: [node for node, kept in enumerate(held) if kept.get(step, {}).get(name) == entry.size]
            for name, entry in files.items()
        }
        if all(holders.values()):
            return Completion(
                step, shares[0].world_size, files, shares[0].resume, {name: min(h) for name, h in holders.items()}
            )
    return None


def _whole_save(shares: Mapping[int, ShareRecord]) -> bool:
    """Whether ``shares`` are every node's share of one save, and agree on what it is."""
    first = next(iter(shares.values()))
    names = [name for share in shares.values() for name in share.files]
    return (
        set(shares) == set(range(first.nodes))
        and all((s.nodes, s.world_size) == (first.nodes, first.world_size) for s in shares.values())
        and len(names) == len(set(names))  # each file in one share (node_parts.plan_node_saves)
    )


def upload_from_copies(
    store: ObjectStore, plan: Completion, node: int, copies: NodeCopies, attempt: AttemptId | None = None
) -> int:
    """Node ``node``'s files of ``plan`` from its copies to the store, each hashed against its record
    first; returns the bytes uploaded. Raises ``CorruptCheckpointError`` on a file that does not match."""
    names = plan.files_of(node)
    for name in names:
        path, entry = copies.path_of(plan.step, name), plan.files[name]
        if path.stat().st_size != entry.size or file_sha256(path) != entry.sha256:
            raise CorruptCheckpointError(
                f"checkpoint-{plan.step}: the copy of {name} on node {node} does not match its record",
                "nothing to do: the run resumes from the store's newest complete checkpoint",
            )
    if attempt is not None:
        check_fence(store, attempt)
    prefix = checkpoint_dir_name(plan.step)
    store.upload_files([(copies.path_of(plan.step, name), f"{prefix}/{name}") for name in names])
    return sum(plan.files[name].size for name in names)


def write_completed_manifest(store: ObjectStore, plan: Completion, attempt: AttemptId | None = None) -> Manifest:
    """Rank 0, once every node uploaded its files: the manifest, signed, from the records."""
    check_uploaded(store, plan.step, plan.files)
    if attempt is not None:
        check_fence(store, attempt)
    manifest = Manifest(plan.step, plan.world_size, plan.files, time.time(), installed_versions(), plan.resume)
    store.put_bytes(f"{checkpoint_dir_name(plan.step)}/{MANIFEST_NAME}", manifest_json(manifest, store.checkpoint_key))
    return manifest
