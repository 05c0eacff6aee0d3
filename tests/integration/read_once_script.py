"""Run by test_read_once.py under torchrun: every rank resumes with ``ResumeFetch`` as if on the nodes
that LAYOUT names, twice (the second as a worker restarted on the same node), and writes what it ended
with to OUT/rank-<rank>.json: the step, the SHA-256 of each file of its node's copy, and the bytes this
process read from S3 after each resume (counted as they arrive; the reads are the real ones).

LAYOUT: "4x1" is four nodes of one process each (a directory per rank), "2x2" two nodes of two
processes each (ranks 0-1 share a directory, 2-3 another). With BAD_PEER=<rank>, that rank's node
sends the others a wrong byte in each piece it read (a fault no real part makes on demand).

python -m torch.distributed.run --nproc-per-node 4 tests/integration/read_once_script.py URI OUT LAYOUT
"""

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch.distributed as dist

from spotray.train.checkpoints import resume, shared_read
from spotray.train.checkpoints.shared_read import NodeLayout, Share
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.storage.store import S3ObjectStore, open_store

read = {"bytes": 0}
real_read_range = S3ObjectStore._read_range


def counted_read_range(store: S3ObjectStore, key: str, offset: int, length: int | None) -> Iterator[bytes]:
    for chunk in real_read_range(store, key, offset, length):
        read["bytes"] += len(chunk)
        yield chunk


def bad_peer(real: Callable[..., Share]) -> Callable[..., Share]:
    """``read_share``, then the first byte of each of the node's pieces changed."""

    def read_share(*args: object) -> Share:
        share = real(*args)
        layout = args[3]
        assert isinstance(layout, NodeLayout)
        for piece in share.pieces:
            if piece.node == layout.node:
                with (share.source / piece.name).open("r+b") as handle:
                    handle.seek(piece.offset)
                    first = handle.read(1)
                    handle.seek(piece.offset)
                    handle.write(bytes([first[0] ^ 0xFF]))
        return share

    return read_share


if __name__ == "__main__":
    uri, out, layout = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    S3ObjectStore._read_range = counted_read_range  # type: ignore[method-assign,assignment]
    # Pieces of 2 MiB, so that the test's files of 5 and 9 MB are cut, as a real checkpoint's are at 64 MiB.
    shared_read.PIECE_BYTES = 2 << 20
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.environ.get("BAD_PEER") == str(rank):
        setattr(resume, "read_share", bad_peer(shared_read.read_share))  # noqa: B010 - the name resume.py calls
    per_node = int(layout.split("x")[1])
    reads = []
    for _ in range(2):
        point = resume.ResumeFetch(open_store(uri), out / f"node-{rank // per_node}").wait()
        reads.append(read["bytes"])
    assert point is not None
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in point.local_dir.iterdir() if p.is_file()}
    result = {"step": point.step, "files": files, "read_bytes": reads}
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    destroy_process_group()
