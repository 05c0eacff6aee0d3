"""Ranged downloads hashed as they arrive (train/storage/hashed_download.py), with ranges finishing out of order
and failing: the reader here stands in for S3 only to choose timing and faults; the S3 path itself is
tested against SeaweedFS in tests/integration/test_resume_fetch.py."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotray.train.storage.hashed_download import FileToFetch, ShortReadError, copy_hashed, download_hashed

pytestmark = pytest.mark.unit

PART = 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Objects:
    """Objects by key; early ranges answer last, so every hash has to wait for its earlier parts."""

    def __init__(self, objects: dict[str, bytes], *, fail: tuple[str, int] | None = None, short: str | None = None):
        self.objects = objects
        self.fail = fail
        self.short = short
        self.reads = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, key: str, offset: int, length: int | None) -> list[bytes]:
        with self._lock:
            self.reads += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            data = self.objects[key]
            time.sleep(0.02 if offset == 0 else 0.001)
            if self.fail == (key, offset):
                raise ConnectionResetError(f"injected: connection reset reading {key} at {offset}")
            part = data[offset:] if length is None else data[offset : offset + length]
            part = part[:-1] if key == self.short else part
            return [part[start : start + 300] for start in range(0, len(part), 300)]  # as a stream comes
        finally:
            with self._lock:
                self.in_flight -= 1


def test_parts_arriving_out_of_order_give_the_bytes_and_the_hash(tmp_path: Path) -> None:
    objects = {"big": os.urandom(10 * PART + 17), "exact": os.urandom(3 * PART), "empty": b"", "small": b"abc"}
    files = [FileToFetch(key, tmp_path / key, len(data)) for key, data in objects.items()]
    files.append(FileToFetch("big", tmp_path / "unsized", None))  # size unknown: one request
    reader = Objects(objects)
    digests, failures = download_hashed(files, reader, part_bytes=PART, concurrency=4)
    assert failures == []
    for target in files:
        assert target.path.read_bytes() == objects[target.key]
        assert digests[target.path] == sha(objects[target.key])
    assert reader.reads == 11 + 3 + 0 + 1 + 1  # an empty file of known size needs no request


def test_many_parts_on_many_threads_hash_in_order_and_no_chunk_is_kept(tmp_path: Path) -> None:
    """The reader may reuse its buffer for the next chunk (as a zero-copy reader would): the hash is
    taken from the file, so it must not depend on a chunk staying as it was when written."""
    data = os.urandom(40 * PART)

    def reusing_reader(key: str, offset: int, length: int | None) -> Iterator[bytes]:
        buffer = bytearray(300)
        end = len(data) if length is None else offset + length
        time.sleep(0.02 if offset == 0 else 0.001)  # the first range lands last
        for start in range(offset, end, len(buffer)):
            piece = data[start : min(start + len(buffer), end)]
            buffer[: len(piece)] = piece
            yield memoryview(buffer)[: len(piece)]  # type: ignore[misc]
            buffer[:] = b"\0" * len(buffer)  # the next read overwrites it

    files = [FileToFetch("a", tmp_path / "a", len(data)), FileToFetch("b", tmp_path / "b", None)]
    digests, failures = download_hashed(files, reusing_reader, part_bytes=PART, concurrency=8)
    assert failures == []
    assert digests == {tmp_path / "a": sha(data), tmp_path / "b": sha(data)}
    assert (tmp_path / "a").read_bytes() == data


def test_a_failed_range_fails_its_file_only(tmp_path: Path) -> None:
    objects = {"a": os.urandom(8 * PART), "b": os.urandom(8 * PART)}
    reader = Objects(objects, fail=("a", 3 * PART))
    files = [FileToFetch(key, tmp_path / key, len(data)) for key, data in objects.items()]
    digests, failures = download_hashed(files, reader, part_bytes=PART, concurrency=4)
    assert [(target.key, type(error)) for target, error in failures] == [("a", ConnectionResetError)]
    assert digests == {tmp_path / "b": sha(objects["b"])}


def test_a_short_range_is_a_failure_not_a_wrong_hash(tmp_path: Path) -> None:
    objects = {"cut": os.urandom(3 * PART)}
    files = [FileToFetch("cut", tmp_path / "cut", 3 * PART)]
    digests, failures = download_hashed(files, Objects(objects, short="cut"), part_bytes=PART, concurrency=2)
    assert digests == {}
    assert isinstance(failures[0][1], ShortReadError)
    assert "got 999 of 1000 bytes" in str(failures[0][1])


def test_copy_hashed(tmp_path: Path) -> None:
    data = os.urandom(5 * PART + 1)
    (tmp_path / "src").write_bytes(data)
    assert copy_hashed(tmp_path / "src", tmp_path / "deep" / "dst", chunk_bytes=PART) == sha(data)
    assert (tmp_path / "deep" / "dst").read_bytes() == data
