"""MosaicML streaming's shared memory, released by the cache directory it was registered for.

Streaming keeps each dataset's state in POSIX shared memory (``/dev/shm/NNNNNN_<name>``, one numeric
prefix per dataset) plus two file locks in the temp directory (``NNNNNN_barrier_filelock``,
``NNNNNN_cache_filelock``). A reader that ends normally unlinks its segments; one SIGKILLed with its
process group (a Ray worker lost with its spot node, or stopped by Ray Train's restart) leaves them.
If it died between registering its prefix and making the file locks (inside ``StreamingDataset``'s
constructor), the next reader of the same cache directory fails with streaming's "Reused local
directory" error, and so does every restart after it: a worker lost during start-up never comes back.

Streaming's own ``clean_stale_shared_memory`` does not help: it walks prefixes from 0 and stops at the
first free one (a dead reader above a gap is never found), and it unlinks every prefix it does find,
in use by another run or not. We release by owner instead: the ``locals`` segment of each prefix names
the local directories it was registered for, and a prefix that names our cache directory is ours.

The caller guarantees that no reader of the cache directory is alive on this machine: a run's worker
group is gone before the next one starts, and a cache directory belongs to one run.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Where Linux exposes POSIX shared memory; absent elsewhere (nothing to release there).
SHM_DIR = Path("/dev/shm")  # noqa: S108 (not a temporary file: the shared-memory namespace itself)
# Streaming's segment and lock names (streaming.base.constant; copied so that releasing needs no import
# of streaming, and checked against it by a test).
SEGMENT_NAMES = (
    "locals",
    "barrier",
    "next_epoch",
    "cache_usage",
    "shard_states",
    "shard_access_times",
    "resume",
    "epoch_shape",
    "epoch_data",
)
LOCK_NAMES = ("barrier_filelock", "cache_filelock")
LOCALS_NAME = re.compile(r"^(\d{6,})_locals$")
# A locals segment holds a few paths; a larger one is not streaming's, and is not read whole.
MAX_LOCALS_BYTES = 1 << 20


@dataclass(frozen=True)
class Registration:
    """One streaming prefix: the local directories its dataset was registered for."""

    prefix: int
    local_dirs: tuple[str, ...]


def parse_locals(data: bytes) -> tuple[str, ...]:
    """The directories in a ``locals`` segment: int32 size, then the paths and the prefix, NUL-separated."""
    if len(data) < 4:
        return ()
    size = int.from_bytes(data[:4], sys.byteorder, signed=True)
    text = data[4 : max(4, min(size, len(data)))].decode("utf-8", errors="replace")
    return tuple(text.split("\0")[:-1])


def registrations(shm_dir: Path = SHM_DIR) -> Iterator[Registration]:
    """Every streaming prefix this user can read, with its local directories."""
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return
    for entry in entries:
        match = LOCALS_NAME.match(entry.name)
        if not match:
            continue
        try:
            with entry.open("rb") as segment:
                data = segment.read(MAX_LOCALS_BYTES)
        except OSError:
            continue  # another user's, or released meanwhile
        yield Registration(int(match.group(1)), parse_locals(data))


def owns(cache_dir: Path, local_dir: str) -> bool:
    # abspath, not resolve(): streaming records the directory as os.path.abspath gives it (no symlinks resolved).
    cache = os.path.abspath(cache_dir)  # noqa: PTH100
    return local_dir == cache or local_dir.startswith(cache + os.sep)


def release_streaming_memory(cache_dir: Path, *, shm_dir: Path = SHM_DIR, lock_dir: Path | None = None) -> list[int]:
    """Unlink the segments and file locks of every prefix registered for ``cache_dir``; the prefixes released.

    Only when no reader of ``cache_dir`` is alive on this machine (see the module docstring).
    """
    lock_dir = lock_dir or Path(tempfile.gettempdir())
    released = []
    for registration in registrations(shm_dir):
        if not any(owns(cache_dir, local_dir) for local_dir in registration.local_dirs):
            continue
        stem = f"{registration.prefix:06}"
        try:
            for name in SEGMENT_NAMES:
                (shm_dir / f"{stem}_{name}").unlink(missing_ok=True)
            for name in LOCK_NAMES:
                (lock_dir / f"{stem}_{name}").unlink(missing_ok=True)
        except OSError as error:
            log.warning("could not release streaming's shared memory %s_* of %s: %s", stem, cache_dir, error)
            continue
        released.append(registration.prefix)
    if released:
        log.info("released streaming shared memory of %s: prefixes %s", cache_dir, released)
    return sorted(released)
