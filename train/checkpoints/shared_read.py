"""Read once per run: on a resume across several nodes, each file of the checkpoint comes from S3 once.

Without this, every node downloads the whole checkpoint into its own directory at the moment the
whole run waits for it: N nodes read N times its size from the store, each through its own link
(issue 73). Instead:

1. The ranks tell each other which node they are on (``node_layout``: one directory on one host
   is one node, as ``download_checkpoint`` shares a copy between the processes of a node). The
   lowest rank of each node is its *leader*.
2. Every leader lists the store and bets on the newest complete checkpoint, and ``assign_files``
   gives each node a share of its files, the largest first to the node with the fewest bytes so far,
   so that the reads are spread across the nodes' links. Each leader downloads its share (in the
   background, while the model is built: train/checkpoints/resume.py ``ResumeFetch``), hashed as it
   arrives.
3. Once every leader bet on the same checkpoint and read its share, the leaders exchange the shares
   over the process group (``exchange``: gloo broadcasts in chunks, owner to the others). Each node
   hashes every file it receives and checks it against the signed manifest's SHA-256 before the copy
   is put in place (``install_copy``); a file that does not match is read from S3 instead, so a bad
   peer costs one file's download, never a wrong byte.

Any other outcome (the leaders bet on different checkpoints, a share failed to download, or there is
one node) takes the path of one node as before: each node downloads what rank 0 chose. That path
also decides what a fault means (an older checkpoint, a refusal, an error); this one only saves reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.train.checkpoints.checkpoint import (
    CheckpointInfo,
    FileEntry,
    install_copy,
    partial_copy_dir,
    verified_copy_unchanged,
    verify_local_checkpoint,
)
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)

# Bytes per broadcast: large enough that a collective's fixed cost is nothing beside its bytes, small
# enough that the buffer (one per leader) is no burden on a node's memory.
EXCHANGE_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class NodeLayout:
    """Which node each rank of the process group is on; nodes are numbered by their lowest rank."""

    node_of_rank: tuple[int, ...]
    rank: int

    @property
    def nodes(self) -> int:
        return max(self.node_of_rank, default=0) + 1

    @property
    def node(self) -> int:
        return self.node_of_rank[self.rank]

    @property
    def leaders(self) -> tuple[int, ...]:
        """The lowest rank of each node, by node."""
        return tuple(self.node_of_rank.index(node) for node in range(self.nodes))

    @property
    def is_leader(self) -> bool:
        return self.leaders[self.node] == self.rank


def layout_from_places(places: list[tuple[str, str]], rank: int) -> NodeLayout:
    """The layout of ranks whose (host, directory) pairs are ``places``, by rank: one pair, one node."""
    numbered: dict[tuple[str, str], int] = {}
    for place in places:
        numbered.setdefault(place, len(numbered))
    return NodeLayout(tuple(numbered[place] for place in places), rank)


def node_layout(dest_root: Path) -> NodeLayout:
    """Which node each rank resumes on: a collective (every rank calls it, with its node's directory)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return NodeLayout((0,), 0)
    places: list[tuple[str, str]] = [("", "")] * dist.get_world_size()
    dist.all_gather_object(places, (socket.gethostname(), str(dest_root.resolve())))
    return layout_from_places(places, dist.get_rank())


def assign_files(files: Mapping[str, FileEntry], nodes: int) -> dict[str, int]:
    """Which node reads each file from S3: the largest first, each to the node with the fewest bytes so
    far (the lowest-numbered on a tie), so that every leader computes the same shares."""
    load = [0] * nodes
    owners: dict[str, int] = {}
    for name in sorted(files, key=lambda n: (-files[n].size, n)):
        node = min(range(nodes), key=lambda k: (load[k], k))
        owners[name] = node
        load[node] += files[name].size
    return owners


@dataclass
class Share:
    """What one node's leader holds of the checkpoint before the exchange."""

    info: CheckpointInfo
    owners: dict[str, int]
    source: Path  # where this node's own files are: the copy being assembled, or a verified one already there
    digests: dict[str, str]  # file name -> SHA-256 of the files this node holds
    whole: bool  # a verified copy was already on the node: nothing to read, nothing to receive
    s3_bytes: int = 0
    peer_bytes: int = 0


def read_share(store: ObjectStore, info: CheckpointInfo, dest_root: Path, layout: NodeLayout) -> Share:
    """Download this node's share of ``info`` into its partial copy (a leader's work, in the background)."""
    assert info.manifest is not None
    owners = assign_files(info.manifest.files, layout.nodes)
    final = dest_root / info.prefix
    if final.is_dir() and verified_copy_unchanged(final, info.manifest):
        digests = {name: entry.sha256 for name, entry in info.manifest.files.items()}
        return Share(info, owners, final, digests, whole=True)
    partial = partial_copy_dir(dest_root, info)
    shutil.rmtree(partial, ignore_errors=True)
    mine = [name for name, node in owners.items() if node == layout.node]
    fetched = store.download_files([(f"{info.prefix}/{name}", partial / name) for name in mine])
    partial.mkdir(parents=True, exist_ok=True)  # a node whose share is empty still assembles a copy
    digests = {name: fetched[partial / name] for name in mine}
    # Checked before any peer is sent a byte: a share that does not match is the checkpoint's own fault,
    # and the one-node path passes over it for an older one.
    verify_local_checkpoint(partial, replace(info.manifest, files={n: info.manifest.files[n] for n in mine}), digests)
    s3_bytes = sum(info.manifest.files[name].size for name in mine)
    return Share(info, owners, partial, digests, whole=False, s3_bytes=s3_bytes)


def exchange(store: ObjectStore, share: Share, dest_root: Path, layout: NodeLayout, group: object) -> Path:
    """Every leader sends its files to the others and receives theirs (a collective of the leaders'
    ``group``); returns the node's verified copy, put in place."""
    info = share.info
    assert info.manifest is not None
    buffer = torch.empty(EXCHANGE_CHUNK_BYTES, dtype=torch.uint8)
    for name in sorted(info.manifest.files):  # the same order on every leader
        entry, owner = info.manifest.files[name], share.owners[name]
        if owner == layout.node:
            _send(share.source / name, entry.size, buffer, layout.leaders[owner], group)
        else:
            digest = _receive(share, name, buffer, layout.leaders[owner], group)
            if not share.whole and digest != entry.sha256:
                log.warning("%s/%s from node %d does not match the manifest: read from S3", info.prefix, name, owner)
                target = share.source / name
                digest = store.download_files([(f"{info.prefix}/{name}", target)])[target]
                share.s3_bytes += entry.size
            share.digests[name] = digest
    if share.whole:
        return share.source
    return install_copy(dest_root, info, share.source, share.digests)


def _send(path: Path, size: int, buffer: torch.Tensor, src: int, group: object) -> None:
    with path.open("rb") as handle:
        for offset in range(0, size, EXCHANGE_CHUNK_BYTES):
            chunk = buffer[: min(EXCHANGE_CHUNK_BYTES, size - offset)]
            if handle.readinto(chunk.numpy().data) != chunk.numel():
                raise OSError(f"{path} changed while it was sent to the other nodes")
            dist.broadcast(chunk, src=src, group=group)  # type: ignore[arg-type]


def _receive(share: Share, name: str, buffer: torch.Tensor, src: int, group: object) -> str:
    """Receive one file from ``src`` (written to the copy unless the node has a whole one); its SHA-256."""
    assert share.info.manifest is not None
    size = share.info.manifest.files[name].size
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        out = None
        if not share.whole:  # a node with a whole copy takes part in each broadcast and drops its bytes
            target = share.source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(target.open("wb"))
        for offset in range(0, size, EXCHANGE_CHUNK_BYTES):
            chunk = buffer[: min(EXCHANGE_CHUNK_BYTES, size - offset)]
            dist.broadcast(chunk, src=src, group=group)  # type: ignore[arg-type]
            if out is not None:
                data = chunk.numpy().data
                digest.update(data)
                out.write(data)
                share.peer_bytes += len(data)
    return digest.hexdigest()
