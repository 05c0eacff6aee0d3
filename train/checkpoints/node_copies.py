"""Copies of the newest checkpoints kept on the nodes: each node's own files, and its ring neighbour's.

S3 is where a checkpoint is safe, but reading it back is slow (a real bucket gives a node 100-200
MB/s) and the whole run waits for it at every resume. Most resumes start where most of the nodes are
still up: Ray Train restarts its worker group on the nodes it has after a worker or one node is
lost, and a kept Ray cluster (``rayJob.rayClusterPerRun``) keeps its worker pods from one attempt to
the next. Those nodes still hold what they saved (issue 73, item 2):

1. At each save, each node's first process keeps the files its node uploads (``NodeCopies.keep_own``:
   hard links to the staged files, so no bytes are copied and no memory is added when the work
   directory is a tmpfs).
2. While the upload runs, a thread sends them to the next node in a ring (node k to node k+1, over a
   gloo group of the nodes' first processes: ``PeerCopies``) and keeps what the previous node sends
   it beside its own. Every file is then on two nodes: the loss of any one node leaves a copy of the
   whole checkpoint on the others.
3. After each node's bytes, the ring carries its *record* (``ShareRecord``): which save they are
   (step, save id, the node and the number of nodes, world size, checkpoint URI), each file's size
   and SHA-256 (the sender hashes as it reads), and node 0's ``resume`` (where the data stands). Both
   nodes keep it beside the files. The receiver does not hash what arrives (one hash per byte, not
   two, while a notice waits for the copy): a copy is hashed where it is used, by a resume's exchange
   against the signed manifest and by a completion against the record before its upload. A byte
   changed on the way (TCP's checksum missed it) is found there: that use falls back to the store's
   newest complete checkpoint, as when the copy is lost; a wrong checkpoint is never resumed or made.
4. A node keeps the newest ``keep`` checkpoints and deletes older ones, but not the newest ``keep`` whose
   round is over before a newer save's round is (so at most twice ``keep`` while a round runs).

The records make the copies a checkpoint of their own when its upload never finished (the attempt
died during it: a spot node gone, a notice shorter than the upload): at the next start, if the nodes
hold every node's share of a save newer than the store's newest complete checkpoint, they upload it
from their copies and sign its manifest before resuming (train/checkpoints/complete_from_copies.py).

At a resume (train/checkpoints/shared_read.py) every node says what it holds, files held by a node
are read from there rather than from S3, and every byte is verified against the signed manifest, as
bytes read from S3 are. Nothing here is trusted: a copy that is missing, short or wrong costs a read
from S3, never a wrong resume. The copies are where the work directory is: mount it as an
``emptyDir`` with ``medium: Memory`` to keep them in host memory (docs/resume.md says what that costs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import shutil
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spotray.contract.bounded_json import load_json
from spotray.train.checkpoints.checkpoint import (
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_VALUES,
    FileEntry,
    check_file_name,
    checkpoint_dir_name,
    link_or_copy,
    parse_checkpoint_step,
)

log = logging.getLogger(__name__)

# Bytes per send: as the resume's exchange (shared_read.EXCHANGE_CHUNK_BYTES), one buffer each way.
CHUNK_BYTES = 64 << 20
# Chunks each way on the wire at once: 2 keeps the link busy while a chunk is read, written and hashed
# (bench/micro/ring_pipeline.py measures 2 against 1, the lockstep the ring began with).
CHUNKS_IN_FLIGHT = 2
# A neighbour that stops answering (its node lost, its process killed) ends the copying after this
# long, not the training: the copies are a faster path, S3 stays the safe one.
TRANSFER_TIMEOUT = timedelta(minutes=5)
# Where received files are written until their last byte is in (under the root).
_INCOMING = ".incoming"
# Where the records of the shares a node holds are kept (under the root): records/checkpoint-<step>/node-<k>.json.
_RECORDS = ".records"


@dataclass(frozen=True)
class ShareRecord:
    """One node's share of one save, as the nodes that hold its files keep it (the save's node numbers).

    What a manifest needs, but for the other shares: node 0's holds ``resume``. Its hashes are the
    sender's, taken as it read the files it sent: what every use of a copy checks the copy against.
    """

    step: int
    save_id: str  # the same for every share of one save (train/checkpoints/node_parts.py)
    node: int
    nodes: int
    world_size: int
    uri: str  # the checkpoint URI the save was for: copies are never completed into another
    files: dict[str, FileEntry] = field(default_factory=dict)
    resume: dict[str, Any] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {name: entry.size for name, entry in self.files.items()}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ShareRecord:
        """Parse a record (bounded as a manifest); ``ValueError`` naming ``where`` when it is not one."""
        try:
            raw = load_json(data, max_bytes=MAX_MANIFEST_BYTES, max_values=MAX_MANIFEST_VALUES)
            files = {str(name): FileEntry(int(e["size"]), str(e["sha256"])) for name, e in raw["files"].items()}
            for name in files:
                check_file_name(name, where)
            return cls(
                int(raw["step"]), str(raw["save_id"]), int(raw["node"]), int(raw["nodes"]), int(raw["world_size"]),
                str(raw["uri"]), files, dict(raw["resume"]),
            )  # fmt: skip
        except (TypeError, KeyError, AttributeError, OverflowError) as error:
            raise ValueError(f"{where} is not a share record ({type(error).__name__}: {error})") from error


def node_copies_dir(workdir: Path) -> Path:
    """Where a node keeps its copies: beside its resume copy (train/checkpoints/resume.py ``node_resume_dir``)."""
    return workdir / "node-copies"


class NodeCopies:
    """The checkpoints one node keeps: ``root/checkpoint-<step>/<file>``, the newest ``keep`` steps."""

    def __init__(self, root: Path, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.root = root
        self.keep = keep
        # Steps whose files are waiting to be sent to the next node: no prune deletes them before.
        self.sending: set[int] = set()
        # Steps safe only here (an emergency checkpoint counted safe at its copies before its upload ended):
        # no newer save's prune deletes them while this process lives; the next start completes them.
        self.pinned: set[int] = set()

    def dir_of(self, step: int) -> Path:
        return self.root / checkpoint_dir_name(step)

    def keep_own(self, step: int, staged: Path) -> dict[str, Path]:
        """Keep the files of ``staged`` (a node's share of the save of ``step``) as hard links; returns
        them by name. Across filesystems they are copied."""
        kept: dict[str, Path] = {}
        shutil.rmtree(self._records_of(step), ignore_errors=True)  # an earlier save's records are not this one's
        for path in sorted(p for p in staged.rglob("*") if p.is_file()):
            name = path.relative_to(staged).as_posix()
            kept[name] = self.dir_of(step) / name
            link_or_copy(path, kept[name])
        self.prune()
        return kept

    def receiving(self, step: int, name: str) -> Path:
        """Where a file another node sends is written until it is whole (``received`` puts it in place):
        outside the steps' folders, so that no prune deletes it half written and no resume takes it."""
        check_file_name(name, f"a file another node sent for checkpoint-{step}")
        path = self.root / _INCOMING / checkpoint_dir_name(step) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def received(self, step: int, names: list[str], record: ShareRecord | None = None) -> None:
        """Put the files another node sent for ``step`` in place, then its record, unless newer saves
        have taken its room."""
        incoming = self.root / _INCOMING / checkpoint_dir_name(step)
        if step in self.newest_steps():
            for name in names:
                target = self.dir_of(step) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                (incoming / name).replace(target)
            if record is not None:
                self.keep_record(record)
        self.drop_incoming(step)
        self.prune()

    def drop_incoming(self, step: int) -> None:
        shutil.rmtree(self.root / _INCOMING / checkpoint_dir_name(step), ignore_errors=True)

    def _records_of(self, step: int) -> Path:
        return self.root / _RECORDS / checkpoint_dir_name(step)

    def keep_record(self, record: ShareRecord) -> None:
        """Keep ``record`` beside its files (written last: a record names only files in place)."""
        directory = self._records_of(record.step)
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".node-{record.node}.json.partial"
        partial.write_bytes(record.to_json())
        partial.replace(directory / f"node-{record.node}.json")

    def records(self) -> list[ShareRecord]:
        """The records of the shares this node holds whole (every file at its size), newest step first.
        One that cannot be read is passed over with a warning: it only costs a completion."""
        found: list[ShareRecord] = []
        held = self.held()
        for step in sorted(held, reverse=True):
            for path in sorted(self._records_of(step).glob("node-*.json")):
                try:
                    record = ShareRecord.from_json(path.read_bytes(), str(path))
                except (OSError, ValueError) as error:
                    log.warning("passing over the record %s: %s", path, error)
                    continue
                if record.step == step and all(held[step].get(n) == e.size for n, e in record.files.items()):
                    found.append(record)
        return found

    def newest_steps(self) -> list[int]:
        """The steps this node keeps: the newest ``keep`` it holds, and any newer one arriving."""
        held = set(self.held())
        arriving = {parse_checkpoint_step(d.name) for d in (self.root / _INCOMING).glob("checkpoint-*")}
        return sorted(held | {s for s in arriving if s is not None}, reverse=True)[: self.keep]

    def held(self) -> dict[int, dict[str, int]]:
        """Every file this node holds, by step: its size (what a resume checks before it asks for it)."""
        found: dict[int, dict[str, int]] = {}
        if not self.root.is_dir():
            return found
        for directory in self.root.iterdir():
            step = parse_checkpoint_step(directory.name)
            if step is None or not directory.is_dir():
                continue
            found[step] = {
                path.relative_to(directory).as_posix(): path.stat().st_size
                for path in directory.rglob("*")
                if path.is_file()
            }
        return found

    def path_of(self, step: int, name: str) -> Path:
        return self.dir_of(step) / name

    def prune(self) -> None:
        """Delete all but the newest ``keep`` steps, and the newest ``keep`` whose round is over (their records
        kept): a save begun here is not whole until its round ends, and must not take the place of one that is."""
        if not self.root.is_dir():
            return
        settled = sorted({record.step for record in self.records()}, reverse=True)[: self.keep]
        keep = set(self.newest_steps()) | set(settled) | self.sending | self.pinned
        for directory in [*self.root.iterdir(), *(self.root / _RECORDS).glob("checkpoint-*")]:
            step = parse_checkpoint_step(directory.name)
            if step is not None and step not in keep:
                shutil.rmtree(directory, ignore_errors=True)


@dataclass
class PeerRound:
    """One save's turn in the ring: every node takes part in every round, with files or without."""

    step: int
    ready: threading.Event = field(default_factory=threading.Event)
    files: dict[str, Path] = field(default_factory=dict)
    # What the files are (their entries filled as they are sent); None: a save skipped on this node.
    record: ShareRecord | None = None
    done: threading.Event = field(default_factory=threading.Event)  # played, or given up
    copied: bool = False  # played whole: this node's files are on the next node, the previous node's here


class PeerCopies:
    """Sends each save's files of this node to the next node and keeps the previous node's, in order.

    Every node's first process makes one (``leaders``: the global rank of each node's first process,
    by node; ``node``: this one's), and the callback opens a round for every save on every node
    (``open_round``), the same saves in the same order, then fills it with the node's files when
    they are staged (``offer``; an async save stages them later, from its writer thread) or with none
    (a save skipped on this node). A thread plays the rounds in order, so a slow round never reorders
    what follows. The first failure (a neighbour gone, a timeout) stops the copying for the rest of
    the process, with one warning: uploads and resumes go on without it.
    """

    def __init__(self, copies: NodeCopies, group: object, leaders: tuple[int, ...], node: int) -> None:
        self.copies = copies
        self.group = group
        self.node = node
        self.next_rank = leaders[(node + 1) % len(leaders)]
        self.previous_rank = leaders[(node - 1) % len(leaders)]
        self.failed: BaseException | None = None
        self.sent_bytes = 0
        self.received_bytes = 0
        self._rounds: queue.Queue[PeerRound | None] = queue.Queue()
        self._thread = threading.Thread(target=self._play, name="spotray-peer-copies", daemon=True)
        self._thread.start()

    def open_round(self, step: int) -> PeerRound:
        round_ = PeerRound(step)
        self.copies.sending.add(step)  # a newer save's prune must not take these files before they are sent
        self._rounds.put(round_)
        return round_

    @staticmethod
    def offer(round_: PeerRound, files: Mapping[str, Path], record: ShareRecord | None = None) -> None:
        round_.files = dict(files)
        round_.record = record
        round_.ready.set()

    def close(self) -> None:
        """Wait until every round opened so far is played (the last save's copy is made), then stop.
        Bounded: a round never filled (its save failed) or a neighbour that never answers ends the wait."""
        self._rounds.put(None)
        self._thread.join(timeout=2 * TRANSFER_TIMEOUT.total_seconds())

    def _play(self) -> None:
        while (round_ := self._rounds.get()) is not None:
            try:
                if self.failed is not None:
                    continue
                if not round_.ready.wait(TRANSFER_TIMEOUT.total_seconds()):
                    raise TimeoutError(f"checkpoint-{round_.step}'s files were never staged on this node")
                self._swap(round_)
                round_.copied = True
            except Exception as error:  # noqa: BLE001 - a faster path lost, said once; S3 still has every checkpoint
                self.failed = error
                log.warning(
                    "copying checkpoints to the next node stopped (%s: %s): resumes read from S3 what no node holds",
                    type(error).__name__,
                    error,
                )
            finally:
                self.copies.sending.discard(round_.step)
                round_.done.set()
        self.copies.prune()

    def _swap(self, round_: PeerRound) -> None:
        """This node's files to the next node, the previous node's from it: a header of names and sizes
        each way, then the bytes, chunk by chunk, each file hashed by its sender as it is read; then each
        side's record, with the hashes of what it sent. A record that does not describe the files that
        arrived (another step, other names or sizes) drops the whole round's copy (and stops the copying)."""
        sizes = {name: path.stat().st_size for name, path in round_.files.items()}
        incoming = json.loads(self._exchange_bytes(json.dumps({"step": round_.step, "files": sizes}).encode()))
        step, incoming_sizes = int(incoming["step"]), {str(k): int(v) for k, v in incoming["files"].items()}
        outgoing = _FileStream([(round_.files[name], size) for name, size in sizes.items()])
        targets = [(self.copies.receiving(step, name), size) for name, size in incoming_sizes.items()]
        try:
            with _FileStream(targets, write=True) as receiving, outgoing:
                self._stream(outgoing, receiving)
            sent = _filled(round_.record, sizes, outgoing.digests)
            record = self._exchange_bytes(sent.to_json() if sent is not None else b"null")
            if sent is not None:
                self.copies.keep_record(sent)  # its own files are whole here, whatever became of the copy
            their = None if record == b"null" else ShareRecord.from_json(record, f"checkpoint-{step}'s record")
            if their is not None and (their.step != step or their.sizes() != incoming_sizes):
                raise OSError(f"checkpoint-{step}'s record from the previous node does not describe the files it sent")
        except BaseException:
            self.copies.drop_incoming(step)
            raise
        self.copies.received(step, list(incoming_sizes), their)

    def _stream(self, outgoing: _FileStream, receiving: _FileStream) -> None:
        """Every byte of ``outgoing`` to the next node, the previous node's into ``receiving``, in chunks
        of ``CHUNK_BYTES`` with ``CHUNKS_IN_FLIGHT`` of them on the wire each way: while gloo carries
        one, this thread reads and hashes the next to send and writes the one that arrived.
        Gloo matches a pair's sends and receives in the order they are posted."""
        free = deque(
            (torch.empty(CHUNK_BYTES, dtype=torch.uint8), torch.empty(CHUNK_BYTES, dtype=torch.uint8))
            for _ in range(CHUNKS_IN_FLIGHT)
        )
        posted: deque[_Chunk] = deque()
        to_send, to_receive = outgoing.left, receiving.left  # bytes not yet posted
        while to_send or to_receive or posted:
            while free and (to_send or to_receive):
                buffers = free.popleft()
                send, receive = buffers[0][: min(CHUNK_BYTES, to_send)], buffers[1][: min(CHUNK_BYTES, to_receive)]
                outgoing.read_into(send)
                posted.append(
                    _Chunk(
                        buffers,
                        receive,
                        dist.isend(send, self.next_rank, group=self.group) if len(send) else None,  # type: ignore[arg-type]
                        dist.irecv(receive, self.previous_rank, group=self.group) if len(receive) else None,  # type: ignore[arg-type]
                        len(send),
                    )
                )
                to_send, to_receive = to_send - len(send), to_receive - len(receive)
            chunk = posted.popleft()
            _both(chunk.sending, chunk.receiving)
            receiving.write_from(chunk.received)
            self.sent_bytes += chunk.sent_bytes
            self.received_bytes += len(chunk.received)
            free.append(chunk.buffers)
        receiving.finish()

    def _exchange_bytes(self, data: bytes) -> bytes:
        """``data`` to the next node, the previous node's (at most a manifest's bound) from it."""
        length = self._exchange(torch.tensor([len(data)], dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        if not 0 < int(length[0]) <= MAX_MANIFEST_BYTES:
            raise OSError(
                f"the previous node announced {int(length[0])} bytes of header (at most {MAX_MANIFEST_BYTES})"
            )
        received = self._exchange(
            torch.frombuffer(bytearray(data), dtype=torch.uint8), torch.empty(int(length[0]), dtype=torch.uint8)
        )
        return received.numpy().tobytes()

    def _exchange(self, send: torch.Tensor, receive: torch.Tensor) -> torch.Tensor:
        _both(
            dist.isend(send, self.next_rank, group=self.group),  # type: ignore[arg-type]
            dist.irecv(receive, self.previous_rank, group=self.group),  # type: ignore[arg-type]
        )
        return receive


def copies_hold_the_save(reports: Sequence[tuple[int | None, bool, bool]]) -> bool:
    """Whether the nodes that stay hold every file of one save, without the store: from each node's
    (ring place, its round of the save played whole, some rank on it is going), by node.

    Node k's files are on node k and on the next node in the ring (k + 1), each with its record. So
    every file stays on a node that stays when every round was played whole, some node stays, and
    no node that goes is followed by one that goes too. Anything unknown (a node with no ring place:
    it keeps no copies) is a no: the save is then safe only in the store.
    """
    if len(reports) < 2 or any(place is None for place, _, _ in reports):
        return False
    ring = sorted(reports, key=lambda report: report[0] or 0)
    if [place for place, _, _ in ring] != list(range(len(ring))) or not all(copied for _, copied, _ in ring):
        return False
    going = [going for _, _, going in ring]
    if not any(going) or all(going):
        return False
    return all(not going[(k + 1) % len(ring)] for k in range(len(ring)) if going[k])


def _filled(record: ShareRecord | None, sizes: Mapping[str, int], digests: list[str]) -> ShareRecord | None:
    """``record`` with the entries of its files (``sizes``, in the order they were hashed)."""
    if record is None:
        return None
    return replace(
        record,
        files={name: FileEntry(size, digest) for (name, size), digest in zip(sizes.items(), digests, strict=True)},
    )


def _both(send: dist.Work | None, receive: dist.Work | None) -> None:
    """Wait for a send and a receive posted together (either may be absent), so that a ring never waits on itself."""
    for request in (send, receive):
        if request is not None:
            request.wait()


def peer_group(leaders: tuple[int, ...]) -> object:
    """The gloo group of the nodes' first processes: a collective, every rank of the run calls it."""
    return dist.new_group(list(leaders), backend="gloo", timeout=TRANSFER_TIMEOUT)


@dataclass
class _Chunk:
    """One chunk each way posted to gloo: the buffers it uses until both ends are done with them."""

    buffers: tuple[torch.Tensor, torch.Tensor]
    received: torch.Tensor  # the part of buffers[1] the previous node fills
    sending: dist.Work | None
    receiving: dist.Work | None
    sent_bytes: int


class _FileStream:
    """Files read (or written) one after the other as one stream of bytes, chunk by chunk; the files
    read are hashed as they pass (a written copy is hashed where it is used: complete_from_copies, shared_read)."""

    def __init__(self, files: list[tuple[Path, int]], *, write: bool = False) -> None:
        self._files = files
        self._write = write
        self._index = 0
        self._done_in_file = 0
        self._handle: object = None
        self._hasher = None if write else hashlib.sha256()
        self.left = sum(size for _, size in files)
        self.digests: list[str] = []  # the SHA-256 of each file read, in order

    def __enter__(self) -> _FileStream:
        return self

    def __exit__(self, *_: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()  # type: ignore[attr-defined]
            self._handle = None

    def _move(self, chunk: torch.Tensor) -> None:
        view = chunk.numpy().data  # uint8: one byte per item
        done = 0
        while done < len(view):
            path, size = self._files[self._index]
            if self._handle is None:
                self._handle = path.open("wb" if self._write else "rb")
            count = min(size - self._done_in_file, len(view) - done)
            part = view[done : done + count]
            if self._write:
                self._handle.write(part)  # type: ignore[attr-defined]
            elif self._handle.readinto(part) != count:  # type: ignore[attr-defined]
                raise OSError(f"{path} changed while it was sent to the next node")
            if self._hasher is not None:
                self._hasher.update(part)
            done += count
            self._done_in_file += count
            if self._done_in_file == size:
                self._close()
                self._next_file()
        self.left -= len(view)

    def read_into(self, chunk: torch.Tensor) -> None:
        self._skip_empty()
        self._move(chunk)
        self._skip_empty()

    def write_from(self, chunk: torch.Tensor) -> None:
        self._skip_empty()
        self._move(chunk)
        self._skip_empty()

    def finish(self) -> None:
        """Make the empty files that end the stream (no chunk ever carries them)."""
        self._skip_empty()

    def _skip_empty(self) -> None:
        """Files of no bytes are made (when writing) and passed over: no chunk ever carries them."""
        while self._index < len(self._files) and self._files[self._index][1] == 0 and self._done_in_file == 0:
            if self._write:
                self._files[self._index][0].write_bytes(b"")
            self._next_file()

    def _next_file(self) -> None:
        if self._hasher is not None:
            self.digests.append(self._hasher.hexdigest())
            self._hasher = hashlib.sha256()
        self._index += 1
        self._done_in_file = 0
