"""Download objects in parallel ranges and hash them as the bytes arrive: one pass, no second read.

A checkpoint is verified against the SHA-256 of every file in its manifest. Downloading first and
hashing after reads every byte twice and puts the hashing (about 0.6 s a GB on one core) after the
download instead of under it. Here each file is fetched in ranges by a pool of threads (a single
connection to S3 moves far less than a node's bandwidth), every range is written at its offset as
soon as it arrives, and a file's hash takes each range once every range before it is hashed.

Memory is bounded: the thread that submits ranges takes a permit for each and a range gives its
permit back once hashed, so at most ``max_unhashed`` ranges are held at a time. The submitter
takes permits in file order, so the earliest range not yet hashed always holds one: no deadlock.
A failed range fails its file (the other ranges of that file are dropped, their permits given back);
the caller retries whole files.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Reads ``length`` bytes at ``offset`` of an object, as the chunks arrive; length None reads the whole
# object (size unknown). Chunks, not one buffer: each is written as it lands, and no copy joins them.
RangeReader = Callable[[str, int, int | None], Iterable[bytes]]


@dataclass(frozen=True)
class FileToFetch:
    key: str
    path: Path
    size: int | None  # None: not known in advance; fetched in one request


class ShortReadError(ConnectionError):
    """A range came back with fewer bytes than asked: the connection was cut or the object changed."""


@dataclass
class _FileState:
    """One file being fetched: its descriptor, its ordered hash and its first failure."""

    target: FileToFetch
    fd: int
    parts: int
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    next_part: int = 0
    waiting: dict[int, list[bytes]] = field(default_factory=dict)
    hashing: bool = False  # a thread is hashing outside the lock; the others only leave their parts
    failure: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, index: int, chunks: list[bytes]) -> int:
        """Leave part ``index``; hash it and every part it unblocks unless another thread is at it.

        Returns how many permits to give back (one per part hashed or dropped).
        """
        with self.lock:
            if self.failure is not None:
                return 1
            self.waiting[index] = chunks
            if self.hashing:
                return 0  # the thread hashing takes this part too when its turn comes
            self.hashing = True
        released = 0
        while True:
            with self.lock:
                ready = self.waiting.pop(self.next_part, None) if self.failure is None else None
                if ready is None:
                    self.hashing = False
                    return released
                self.next_part += 1
            for chunk in ready:
                self.hasher.update(chunk)  # outside the lock; hashlib releases the GIL on large chunks
            released += 1

    def fail(self, error: BaseException) -> int:
        with self.lock:
            if self.failure is None:
                self.failure = error
            released = 1 + len(self.waiting)
            self.waiting.clear()
            return released


def _ranges(size: int | None, part_bytes: int) -> list[tuple[int, int | None]]:
    if size is None:
        return [(0, None)]
    return [(start, min(part_bytes, size - start)) for start in range(0, size, part_bytes)] or [(0, 0)]


def download_hashed(
    files: Sequence[FileToFetch],
    read_range: RangeReader,
    *,
    part_bytes: int,
    concurrency: int,
    max_unhashed: int | None = None,
) -> tuple[dict[Path, str], list[tuple[FileToFetch, BaseException]]]:
    """Fetch ``files``; return the SHA-256 of each file that arrived whole, and the failures.

    A failed file's partial bytes are left at its path for the caller to replace or delete.
    """
    permits = threading.BoundedSemaphore(max_unhashed or concurrency + 2)
    states: list[_FileState] = []
    futures: list[Future[None]] = []

    def fetch(state: _FileState, index: int, offset: int, length: int | None) -> None:
        try:
            chunks = []
            position = offset
            for chunk in read_range(state.target.key, offset, length) if length != 0 else ():
                os.pwrite(state.fd, chunk, position)
                position += len(chunk)
                chunks.append(chunk)
            if length is not None and position - offset != length:
                raise ShortReadError(
                    f"{state.target.key}: got {position - offset} of {length} bytes at offset {offset}; "
                    "the connection was cut or the object changed meanwhile"
                )
            released = state.add(index, chunks)
        except BaseException as error:  # noqa: BLE001 - any failure fails this file; the caller decides
            released = state.fail(error)
        for _ in range(released):
            permits.release()

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="spotray-download") as pool:
        try:
            for target in files:
                target.path.parent.mkdir(parents=True, exist_ok=True)
                ranges = _ranges(target.size, part_bytes)
                fd = os.open(target.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                state = _FileState(target, fd, len(ranges))
                states.append(state)
                for index, (offset, length) in enumerate(ranges):
                    permits.acquire()
                    if state.failure is not None:
                        permits.release()
                        break
                    futures.append(pool.submit(fetch, state, index, offset, length))
            for future in futures:
                future.result()
        finally:
            for state in states:
                os.close(state.fd)
    digests: dict[Path, str] = {}
    failures: list[tuple[FileToFetch, BaseException]] = []
    for state in states:
        if state.failure is not None:
            failures.append((state.target, state.failure))
        else:
            assert state.next_part == state.parts, "every part of a file without failure was hashed"
            digests[state.target.path] = state.hasher.hexdigest()
    return digests, failures


def copy_hashed(source: Path, target: Path, chunk_bytes: int = 8 << 20) -> str:
    """Copy ``source`` to ``target`` and return the SHA-256 of the bytes copied (one read of each byte)."""
    hasher = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(chunk_bytes):
            hasher.update(chunk)
            writer.write(chunk)
    return hasher.hexdigest()
