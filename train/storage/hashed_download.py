"""Download objects in parallel ranges and hash them as they land: no second pass after the download.

A checkpoint is verified against the SHA-256 of every file in its manifest. Downloading first and
hashing after puts the hashing (about 0.6 s a GB on one core) after the download instead of under
it. Here each file is fetched in ranges by a pool of threads (a single connection to S3 moves far
less than a node's bandwidth), every range is written at its offset as its chunks arrive, and a
file's hash takes each range once every range before it has landed, reading it back from the
file: the page cache, just written, not the disk.

Why read back instead of keeping the chunks until their turn: ranges land out of order, so up to
the whole file waits in memory, and on a VM every such buffer is fresh memory the host has to
supply. Measured on this project's 2-core VM (270 MB, 16 threads, bench/micro/transfer.py's files),
keeping the chunks cost 0.3-1.0 s of kernel time per download against 0.11-0.15 s read back. Memory
is now one chunk per thread and one read buffer per file being hashed, whatever the file's size.
A failed range fails its file (its other ranges are still written, then dropped); the caller
retries whole files.
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


HASH_READ_BYTES = 1 << 20  # the read-back buffer of the file being hashed


@dataclass
class _FileState:
    """One file being fetched: its descriptor, its ordered hash and its first failure."""

    target: FileToFetch
    fd: int
    parts: int
    part_bytes: int
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    next_part: int = 0
    landed: dict[int, int] = field(default_factory=dict)  # part index -> bytes written, not yet hashed
    hashing: bool = False  # a thread is hashing outside the lock; the others only report their parts
    failure: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Read back into by whichever thread is hashing (one at a time); made once per file, not per turn.
    buffer: memoryview = field(default_factory=lambda: memoryview(bytearray(HASH_READ_BYTES)))

    def add(self, index: int, size: int) -> None:
        """Part ``index`` is written; hash it and every part it unblocks, unless another thread is at it."""
        with self.lock:
            if self.failure is not None:
                return
            self.landed[index] = size
            if self.hashing:
                return  # the thread hashing takes this part too when its turn comes
            self.hashing = True
        while True:
            with self.lock:
                size = self.landed.pop(self.next_part, -1) if self.failure is None else -1
                if size < 0:
                    self.hashing = False
                    return
                offset = self.next_part * self.part_bytes
                self.next_part += 1
            self._hash_range(offset, size)  # outside the lock; hashlib releases the GIL

    def _hash_range(self, offset: int, size: int) -> None:
        buffer = self.buffer
        end = offset + size
        while offset < end:
            read = os.preadv(self.fd, [buffer[: min(len(buffer), end - offset)]], offset)
            if read == 0:
                raise ShortReadError(f"{self.target.path} ends at {offset}, before {end}: changed while downloading")
            self.hasher.update(buffer[:read])
            offset += read

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = error
            self.landed.clear()


def _write_range(fd: int, read_range: RangeReader, key: str, offset: int, length: int | None) -> int:
    """Write ``length`` bytes of ``key`` at ``offset`` (None: the whole object) at the same offset of ``fd``
    as its chunks arrive; the bytes written. Raises ShortReadError when fewer than ``length`` arrive."""
    position = offset
    for chunk in read_range(key, offset, length) if length != 0 else ():
        os.pwrite(fd, chunk, position)
        position += len(chunk)
    if length is not None and position - offset != length:
        raise ShortReadError(
            f"{key}: got {position - offset} of {length} bytes at offset {offset}; "
            "the connection was cut or the object changed meanwhile"
        )
    return position - offset


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
) -> tuple[dict[Path, str], list[tuple[FileToFetch, BaseException]]]:
    """Fetch ``files``; return the SHA-256 of each file that arrived whole, and the failures.

    A failed file's partial bytes are left at its path for the caller to replace or delete.
    """
    states: list[_FileState] = []
    futures: list[Future[None]] = []

    def fetch(state: _FileState, index: int, offset: int, length: int | None) -> None:
        if state.failure is not None:
            return  # another range of this file failed: the file is fetched again whole
        try:
            state.add(index, _write_range(state.fd, read_range, state.target.key, offset, length))
        except BaseException as error:  # noqa: BLE001 - any failure fails this file; the caller decides
            state.fail(error)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="spotray-download") as pool:
        try:
            # Files in order and ranges in order: the pool starts them first come first served, so
            # each file's early ranges land first and its hash keeps up with the download.
            for target in files:
                target.path.parent.mkdir(parents=True, exist_ok=True)
                ranges = _ranges(target.size, part_bytes)
                fd = os.open(target.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                state = _FileState(target, fd, len(ranges), part_bytes)
                states.append(state)
                futures += [pool.submit(fetch, state, index, *span) for index, span in enumerate(ranges)]
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


@dataclass(frozen=True)
class RangeToFetch:
    """Bytes ``offset`` to ``offset + length`` of an object, for the same bytes of ``path`` (which exists)."""

    key: str
    path: Path
    offset: int
    length: int


def download_ranges(
    ranges: Sequence[RangeToFetch], read_range: RangeReader, *, part_bytes: int, concurrency: int
) -> list[tuple[RangeToFetch, BaseException]]:
    """Fetch ``ranges`` in parts of ``part_bytes`` in parallel, each written where it belongs in its file
    (nothing hashed: a range is part of a file, and a file is verified whole); the ranges that failed."""

    def fetch(target: RangeToFetch, offset: int, length: int) -> None:
        fd = os.open(target.path, os.O_WRONLY)
        try:
            _write_range(fd, read_range, target.key, offset, length)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="spotray-download") as pool:
        parts = [
            (target, pool.submit(fetch, target, target.offset + start, min(part_bytes, target.length - start)))
            for target in ranges
            for start in range(0, target.length, part_bytes)
        ]
        failed: dict[RangeToFetch, BaseException] = {}
        for target, future in parts:
            error = future.exception()
            if error is not None:
                failed.setdefault(target, error)
    return list(failed.items())


def copy_hashed(source: Path, target: Path, chunk_bytes: int = 8 << 20) -> str:
    """Copy ``source`` to ``target`` and return the SHA-256 of the bytes copied (one read of each byte)."""
    hasher = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(chunk_bytes):
            hasher.update(chunk)
            writer.write(chunk)
    return hasher.hexdigest()
