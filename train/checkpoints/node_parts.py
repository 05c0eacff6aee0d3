"""Checkpoints saved by several nodes, each from its own disk.

On a cluster every worker pod has its own disk, and one Trainer save writes files on every node:
each rank its RNG state (``rng_state_<rank>.pth``), FSDP each rank its shard, ``save_on_each_node``
the whole model on every node. The checkpoint in the store must hold all of them, and still be
either complete or absent whatever dies, and when:

1. At the save, the ranks tell each other which files each node holds (``plan_node_saves``, fed by
   one ``all_gather_object`` that is also the barrier waiting for every rank's files). Each file is
   uploaded by the lowest-numbered node that holds it, so a file every node holds (with
   ``save_on_each_node``, or an output directory shared over NFS) goes up once.
2. Node k > 0 uploads its files, then ``checkpoint-<step>/.parts/node-<k>.json``: their sizes and
   SHA-256, and the save's id.
3. Node 0 uploads its own files, waits for every other node's part of this same save (a part left
   by an older attempt carries another id and is not counted), checks that every listed object is
   there with its size, and writes the one manifest over all the files, last, as always. Until then
   the checkpoint has no manifest and is not complete (train/checkpoints/checkpoint.py).

A node whose uploads fall behind drops a waiting checkpoint (the newest wins, train/checkpoints/uploader.py)
and says so in a part marked ``dropped``; node 0 then abandons that checkpoint instead of waiting.
A save on one node (one process, or several sharing its disk) takes none of this: node 0 uploads
the whole directory as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.contract.bounded_json import load_json
from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import (
    CheckpointAbandonedError,
    CheckpointUploadError,
    CorruptCheckpointError,
    ObjectTooLargeError,
    StoreRequestError,
)
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_VALUES,
    FileEntry,
    Manifest,
    build_manifest,
    check_file_name,
    checkpoint_dir_name,
    manifest_json,
)
from spotray.train.records.attempt_records import check_fence
from spotray.train.storage.store import ObjectStore, get_bytes_if_exists, upload_dir

PARTS_DIR = ".parts"
# What a part record's HMAC is for (spotray/contract/checkpoint_key.py): node 0 copies the files'
# checksums from the parts into the manifest it signs, so a part is checked as a manifest is.
PART_PURPOSE = "checkpoint node part"
# How long node 0 waits for the other nodes' parts once its own files are up. The other nodes
# upload at the same time as node 0, so their parts normally arrive within seconds of its own end;
# a node gone for good takes the whole job with it long before this.
PARTS_TIMEOUT_S = 600.0
_POLL_S = 0.2


def part_key(step: int, node: int) -> str:
    return f"{checkpoint_dir_name(step)}/{PARTS_DIR}/node-{node}.json"


@dataclass(frozen=True)
class NodeSave:
    """One node's share of a checkpoint that several nodes save, each from its own disk."""

    node: int  # 0 writes the manifest
    nodes: int
    save_id: str  # the same on every node for one save; parts with another id are not this save's
    files: tuple[str, ...] = ()  # node > 0: the files it uploads (node 0 uploads whatever it staged)
    dropped: bool = False  # node > 0: it dropped this checkpoint unuploaded; node 0 abandons it


@dataclass(frozen=True)
class NodePart:
    """What node ``node`` uploaded into a checkpoint, written after its files."""

    node: int
    save_id: str
    files: dict[str, FileEntry] = field(default_factory=dict)
    dropped: bool = False

    def to_json(self, key: CheckpointKey | None = None) -> bytes:
        """The part as stored: signed with ``key`` when there is one (node 0 signs the manifest from it)."""
        content = asdict(self)
        return json.dumps(key.sign(PART_PURPOSE, content) if key is not None else content, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str, key: CheckpointKey | None = None) -> NodePart:
        try:
            raw = load_json(data, max_bytes=MAX_MANIFEST_BYTES, max_values=MAX_MANIFEST_VALUES)
            forged = key.problem(PART_PURPOSE, raw) if key is not None else None
            if forged is not None:
                raise CorruptCheckpointError(
                    f"the node part {where} {forged}",
                    "find out who else can write to the bucket; this checkpoint is not completed",
                )
            files = {str(name): FileEntry(int(e["size"]), str(e["sha256"])) for name, e in raw["files"].items()}
            for name in files:
                check_file_name(name, f"the node part {where}")
            return cls(int(raw["node"]), str(raw["save_id"]), files, bool(raw["dropped"]))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as error:
            raise CorruptCheckpointError(
                f"the node part {where} is corrupt ({type(error).__name__}: {error})",
                "spotray never writes such a part: check who can write to the bucket; this checkpoint is not completed",
            ) from error


def plan_node_saves(listings: Sequence[Sequence[str] | None], save_id: str) -> list[NodeSave | None]:
    """Each rank's share of one save, from what every rank reported (in global rank order).

    ``listings[r]`` is the files rank r found in its node's checkpoint directory if it is its node's
    local process zero, else None: nodes are numbered by their first rank. A rank that uploads
    nothing gets None. With one node, rank 0 uploads everything, exactly as a one-process run.
    """
    node_ranks = [rank for rank, listing in enumerate(listings) if listing is not None]
    if not node_ranks or node_ranks[0] != 0:
        raise ValueError(
            "rank 0 is not its node's first process (LOCAL_RANK 0): number the ranks node by node, "
            "as torchrun and Ray Train do"
        )
    shares: list[NodeSave | None] = [None] * len(listings)
    taken: set[str] = set()
    for node, rank in enumerate(node_ranks):
        listing = listings[rank]
        assert listing is not None
        mine = tuple(sorted(set(listing) - taken))
        taken.update(listing)
        shares[rank] = NodeSave(node, len(node_ranks), save_id, mine if node else ())
    return shares


def upload_node_part(
    store: ObjectStore, staged_dir: Path, step: int, share: NodeSave, *, attempt: AttemptId | None = None
) -> NodePart:
    """Node k > 0: retract any manifest, upload this node's files, then its part record."""
    _retract_manifest(store, step, attempt)
    if share.dropped:
        part = NodePart(share.node, share.save_id, dropped=True)
    else:
        files = build_manifest(staged_dir, step, share.nodes).files
        upload_dir(store, staged_dir, checkpoint_dir_name(step))
        part = NodePart(share.node, share.save_id, files)
        if attempt is not None:
            check_fence(store, attempt)
    store.put_bytes(part_key(step, share.node), part.to_json(store.checkpoint_key))
    return part


def upload_shared_checkpoint(
    store: ObjectStore,
    staged_dir: Path,
    step: int,
    world_size: int,
    resume: dict[str, Any],
    *,
    share: NodeSave,
    attempt: AttemptId | None = None,
    parts_timeout_s: float = PARTS_TIMEOUT_S,
) -> Manifest:
    """Node 0: upload its files, wait for every other node's part, then write the one manifest."""
    _retract_manifest(store, step, attempt)
    own = build_manifest(staged_dir, step, world_size, resume)
    upload_dir(store, staged_dir, checkpoint_dir_name(step))
    files = dict(own.files)
    owners = dict.fromkeys(files, 0)
    for part in _wait_for_parts(store, step, share, time.monotonic() + parts_timeout_s):
        for name, entry in part.files.items():
            if name in files and files[name] != entry:
                raise CheckpointUploadError(
                    f"checkpoint-{step}: nodes {owners[name]} and {part.node} uploaded different bytes as {name}",
                    "the nodes' saves disagree: look for a node that wrote into another's directory",
                )
            files[name], owners[name] = entry, part.node
    check_uploaded(store, step, files)
    if attempt is not None:
        check_fence(store, attempt)
    manifest = Manifest(step, world_size, files, time.time(), own.versions, own.resume)
    store.put_bytes(f"{checkpoint_dir_name(step)}/{MANIFEST_NAME}", manifest_json(manifest, store.checkpoint_key))
    return manifest


def _retract_manifest(store: ObjectStore, step: int, attempt: AttemptId | None) -> None:
    """Before any file of this save replaces one of an earlier save of the same step, that earlier
    checkpoint stops being complete. Files of the other nodes are never deleted: they may be this save's."""
    if attempt is not None:
        check_fence(store, attempt)
    store.delete([f"{checkpoint_dir_name(step)}/{MANIFEST_NAME}"])


def _wait_for_parts(store: ObjectStore, step: int, share: NodeSave, deadline: float) -> list[NodePart]:
    """Every other node's part of this save. Each poll is one LIST of the parts; a part is read only
    when it is new or changed (a part of another save is overwritten by this save's, not re-read)."""
    parts: dict[int, NodePart] = {}
    seen: dict[str, str] = {}  # part key -> the etag read last
    wanted = {part_key(step, node): node for node in range(1, share.nodes)}
    while True:
        for info in store.list(f"{checkpoint_dir_name(step)}/{PARTS_DIR}/"):
            node = wanted.get(info.key)
            if node is None or node in parts or seen.get(info.key) == info.etag:
                continue
            part = _read_part(store, info.key)
            if part is None:
                continue  # replaced or gone since the listing: the next poll sees what is there then
            seen[info.key] = info.etag
            if part.save_id == share.save_id:
                parts[node] = part
        dropped = sorted(node for node, part in parts.items() if part.dropped)
        if dropped:
            raise CheckpointAbandonedError(
                f"checkpoint-{step} was abandoned: node {dropped[0]} dropped its part (its uploads fell behind)",
                "checkpoint less often or use faster storage; the previous complete checkpoint is still safe",
            )
        if len(parts) == share.nodes - 1:
            return [parts[node] for node in sorted(parts)]
        if time.monotonic() > deadline:
            missing = ", ".join(str(node) for node in range(1, share.nodes) if node not in parts)
            raise CheckpointUploadError(
                f"checkpoint-{step}: node(s) {missing} did not upload their part in time",
                "look in those nodes' logs for an upload error or a lost node; the last complete checkpoint is safe",
            )
        time.sleep(_POLL_S)


def _read_part(store: ObjectStore, key: str) -> NodePart | None:
    try:
        # Bounded as a manifest is: a part lists a node's share of the same files.
        data = get_bytes_if_exists(store, key, max_bytes=MAX_MANIFEST_BYTES)
    except (FileNotFoundError, StoreRequestError):
        return None  # replaced between the listing and the read: read again at the next poll
    except ObjectTooLargeError as error:
        raise CorruptCheckpointError(error.problem, error.fix) from error
    return None if data is None else NodePart.from_json(data, str(store.uri.join(key)), store.checkpoint_key)


def check_uploaded(store: ObjectStore, step: int, files: dict[str, FileEntry]) -> None:
    prefix = checkpoint_dir_name(step)
    sizes = {info.key[len(prefix) + 1 :]: info.size for info in store.list(prefix + "/")}
    for name, entry in sorted(files.items()):
        if sizes.get(name) != entry.size:
            raise CheckpointUploadError(
                f"checkpoint-{step}: {name} is not in the store with its {entry.size} bytes after its node sent it",
                "something deleted or replaced it meanwhile (another attempt, a prune); the last complete one is safe",
            )
