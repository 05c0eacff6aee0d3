"""Read once per run: on a resume across several nodes, each byte of the checkpoint comes from S3 once.

Without this, every node downloads the whole checkpoint into its own directory at the moment the
whole run waits for it: N nodes read N times its size from the store, each through its own link
(issue 73). Instead:

1. The ranks tell each other which node they are on (``node_layout``: one directory on one host
   is one node, as ``download_checkpoint`` shares a copy between the processes of a node). The
   lowest rank of each node is its *leader*.
2. Every leader lists the store and bets on the newest complete checkpoint. ``assign_pieces`` cuts
   its files into pieces of 64 MiB and gives each node a share, the largest first to the node with
   the fewest bytes so far, so the reads are spread over the nodes' links even when one file (the
   optimizer's state) is most of the checkpoint. A file that a node still holds from the save (its
   own, or its ring neighbour's: train/checkpoints/node_copies.py) is not read from S3: its pieces go
   to the nodes holding it, which read them from their copy. Each leader reads its pieces in the
   background, while the model is built (train/checkpoints/resume.py ``ResumeFetch``).
3. Once every leader holds its share of the same checkpoint, the leaders exchange the pieces over the
   process group (``exchange``: gloo broadcasts, owner to the others, in file order). Every node
   hashes each file as its bytes pass and the copy is put in place only if every file matches the
   signed manifest's SHA-256 (``install_copy``).

Anything else takes the path of one node as before, on every node: the leaders bet on different
checkpoints, a share failed to download, or a file does not match on some node (a damaged object, a
bad transfer: which piece was wrong is not known, so nothing of it is trusted). Then rank 0 chooses
what to resume from, with every fallback and refusal, and each node downloads that checkpoint whole.
This path only saves reads; the one-node path decides what a fault means. A node's kept copy is
trusted no more than S3: its bytes are hashed in the exchange like every other piece.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.train.checkpoints.checkpoint import (
    CheckpointInfo,
    FileEntry,
    link_or_copy,
    partial_copy_dir,
    verified_copy_unchanged,
)
from spotray.train.checkpoints.node_copies import NodeCopies, ShareRecord
from spotray.train.processes.ranks import all_gather_objects
from spotray.train.storage.hashed_download import RangeToFetch
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)

# Bytes per broadcast: large enough that a collective's fixed cost is nothing beside its bytes, small
# enough that the buffer (one per leader) is no burden on a node's memory.
EXCHANGE_CHUNK_BYTES = 64 << 20
# The unit of the shares: small enough that four nodes split a GB evenly, large enough that a piece's
# requests (ranges of DOWNLOAD_PART_BYTES, in parallel) keep a node's link busy.
PIECE_BYTES = 64 << 20


@dataclass(frozen=True)
class NodeLayout:
    """Which node each rank of the process group is on; nodes are numbered by their lowest rank."""

    node_of_rank: tuple[int, ...]
    rank: int
    # What each node keeps of recent checkpoints (NodeCopies.held: step -> file -> size), by node.
    held: tuple[Mapping[int, Mapping[str, int]], ...] = ()
    # The records of the shares each node holds whole (NodeCopies.records), by node.
    records: tuple[tuple[ShareRecord, ...], ...] = ()

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

    def holders(self, info: CheckpointInfo) -> dict[str, list[int]]:
        """The nodes that keep each file of ``info`` at its size (its bytes are checked in the exchange)."""
        assert info.manifest is not None
        kept = [held.get(info.step, {}) for held in self.held]
        return {
            name: [node for node, files in enumerate(kept) if files.get(name) == entry.size]
            for name, entry in info.manifest.files.items()
        }


def layout_from_places(
    places: list[tuple[str, str]],
    rank: int,
    held: list[Mapping[int, Mapping[str, int]]] | None = None,
    records: list[Sequence[ShareRecord]] | None = None,
) -> NodeLayout:
    """The layout of ranks whose (host, directory) pairs are ``places``, by rank: one pair, one node.
    ``held[r]`` and ``records[r]`` are what rank r's node keeps; the node's lowest rank speaks for it."""
    numbered: dict[tuple[str, str], int] = {}
    kept: list[Mapping[int, Mapping[str, int]]] = []
    kept_records: list[tuple[ShareRecord, ...]] = []
    for rank_, place in enumerate(places):
        if place not in numbered:
            numbered[place] = len(numbered)
            kept.append(held[rank_] if held is not None else {})
            kept_records.append(tuple(records[rank_]) if records is not None else ())
    return NodeLayout(tuple(numbered[place] for place in places), rank, tuple(kept), tuple(kept_records))


def node_layout(dest_root: Path, copies: NodeCopies | None = None) -> NodeLayout:
    """Which node each rank resumes on, and what each node keeps: a collective (every rank calls it,
    with its node's directory)."""
    held = copies.held() if copies is not None else {}
    records = copies.records() if copies is not None else []
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return NodeLayout((0,), 0, (held,), (tuple(records),))
    reports = all_gather_objects((socket.gethostname(), str(dest_root.resolve()), held, records))
    places = [(host, directory) for host, directory, _, _ in reports]
    return layout_from_places(
        places, dist.get_rank(), [report[2] for report in reports], [report[3] for report in reports]
    )


def assign_pieces(
    files: Mapping[str, FileEntry],
    nodes: int,
    piece_bytes: int = PIECE_BYTES,
    holders: Mapping[str, Sequence[int]] | None = None,
) -> list[Piece]:
    """Every file cut into pieces of at most ``piece_bytes``, each piece read by one node: the largest
    first, each to the node with the fewest bytes so far (the lowest-numbered on a tie), so that every
    leader computes the same pieces and no node reads much more than its share. A file some nodes
    keep (``holders``) is read only by them, from their copies; the others from S3, by any node. In
    file order (name, then offset): the order of the exchange, in which every node hashes each file
    as it passes."""
    holders = holders or {}
    cut = [
        (name, offset, min(piece_bytes, files[name].size - offset))
        for name in sorted(files)
        for offset in range(0, files[name].size, piece_bytes)
    ]
    load = [0] * nodes
    owner: dict[tuple[str, int], int] = {}
    for name, offset, length in sorted(cut, key=lambda c: (-c[2], c[0], c[1])):
        node = min(holders.get(name) or range(nodes), key=lambda k: (load[k], k))
        owner[(name, offset)] = node
        load[node] += length
    return [
        Piece(name, offset, length, owner[(name, offset)], kept=bool(holders.get(name))) for name, offset, length in cut
    ]


@dataclass(frozen=True)
class Piece:
    """Bytes ``offset`` to ``offset + length`` of file ``name`` of the checkpoint, read by ``node``: from
    the copy it keeps when ``kept``, else from S3."""

    name: str
    offset: int
    length: int
    node: int
    kept: bool = False


@dataclass
class Share:
    """What one node's leader holds of the checkpoint before the exchange."""

    info: CheckpointInfo
    pieces: list[Piece]
    source: Path  # the copy being assembled, or the verified copy already on the node
    whole: bool  # a verified copy was already on the node: nothing to read, nothing to keep of the exchange
    s3_bytes: int = 0
    peer_bytes: int = 0
    kept_bytes: int = 0  # read from the copies the node kept (train/checkpoints/node_copies.py)


def read_share(
    store: ObjectStore, info: CheckpointInfo, dest_root: Path, layout: NodeLayout, copies: NodeCopies | None = None
) -> Share:
    """Read this node's pieces of ``info`` into its partial copy, from the copies it keeps or from S3
    (a leader's work, in the background)."""
    assert info.manifest is not None
    pieces = assign_pieces(info.manifest.files, layout.nodes, PIECE_BYTES, layout.holders(info))
    final = dest_root / info.prefix
    if final.is_dir() and verified_copy_unchanged(final, info.manifest):
        return Share(info, pieces, final, whole=True)
    partial = partial_copy_dir(dest_root, info)
    shutil.rmtree(partial, ignore_errors=True)
    for name, entry in info.manifest.files.items():  # every file at its size: pieces land at their offsets
        path = partial / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            handle.truncate(entry.size)
    mine = [piece for piece in pieces if piece.node == layout.node]
    from_s3 = [piece for piece in mine if not piece.kept]
    from_copies = [piece for piece in mine if piece.kept]
    if from_copies:
        assert copies is not None, "a node that keeps no copies was given pieces to read from one"
        whole_files = {p.name for p in pieces} - {p.name for p in pieces if p.node != layout.node or not p.kept}
        for name in whole_files:  # every piece of it is this node's: link the kept file, copy nothing
            link_or_copy(copies.path_of(info.step, name), partial / name)  # the exchange only reads own pieces
        for piece in from_copies:
            if piece.name not in whole_files:
                _copy_range(copies.path_of(info.step, piece.name), partial / piece.name, piece.offset, piece.length)
    ranges = [RangeToFetch(f"{info.prefix}/{p.name}", partial / p.name, p.offset, p.length) for p in from_s3]
    store.download_ranges(ranges)
    return Share(
        info, pieces, partial, whole=False,
        s3_bytes=sum(p.length for p in from_s3), kept_bytes=sum(p.length for p in from_copies),
    )  # fmt: skip


def _copy_range(source: Path, target: Path, offset: int, length: int) -> None:
    """Bytes ``offset`` to ``offset + length`` of ``source`` into the same place of ``target``."""
    with source.open("rb") as reader, target.open("r+b") as writer:
        reader.seek(offset)
        writer.seek(offset)
        left = length
        while left:
            chunk = reader.read(min(left, EXCHANGE_CHUNK_BYTES))
            if not chunk:
                raise OSError(f"{source} is shorter than the checkpoint's file it keeps")
            writer.write(chunk)
            left -= len(chunk)


def exchange(share: Share, layout: NodeLayout, group: object) -> dict[str, str]:
    """Every leader sends its pieces to the others and receives theirs (a collective of the leaders'
    ``group``, pieces in file order); returns the SHA-256 of every file of the node's copy, computed
    as its bytes passed, for the caller to check against the manifest."""
    info = share.info
    assert info.manifest is not None
    hashers = {name: hashlib.sha256() for name in info.manifest.files}
    buffer = torch.empty(EXCHANGE_CHUNK_BYTES, dtype=torch.uint8)
    for name, pieces in itertools.groupby(share.pieces, key=lambda piece: piece.name):  # file order: one open at a time
        path = share.source / name
        with path.open("rb") if share.whole else path.open("r+b") as handle:  # a verified copy is only read
            for piece in pieces:
                mine = piece.node == layout.node
                for offset in range(piece.offset, piece.offset + piece.length, EXCHANGE_CHUNK_BYTES):
                    chunk = buffer[: min(EXCHANGE_CHUNK_BYTES, piece.offset + piece.length - offset)]
                    data = chunk.numpy().data
                    if mine:
                        handle.seek(offset)
                        if handle.readinto(data) != len(data):
                            raise OSError(f"{path} changed while it was sent to the other nodes")
                    dist.broadcast(chunk, src=layout.leaders[piece.node], group=group)  # type: ignore[arg-type]
                    if not mine and not share.whole:
                        handle.seek(offset)
                        handle.write(data)
                        share.peer_bytes += len(data)
                    hashers[name].update(data)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}
