"""One of bench/micro/read_once.py's four "nodes", under torchrun: resume, timed between two barriers.

python -m torch.distributed.run --standalone --nproc-per-node 4 bench/micro/read_once_node.py \
    LEG STORE_URI NODES_DIR ENDPOINTS OUT

LEG: read_once (``ResumeFetch``), kept (``ResumeFetch`` with the copies each node kept, in
NODES_DIR/../copies/node-<rank>: bench/micro/node_copies_resume.py) or per_node
(``fetch_resume_checkpoint``, the whole checkpoint per node). ENDPOINTS: one S3 endpoint per rank
(each node's own proxy); rank 0 writes OUT.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from spotray.train.checkpoints.node_copies import NodeCopies
from spotray.train.checkpoints.resume import ResumeFetch, fetch_resume_checkpoint
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.storage.store import open_store

if __name__ == "__main__":
    leg, uri, nodes, endpoints, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.environ["AWS_ENDPOINT_URL"] = endpoints.split(",")[rank]  # this node's own link
    store = open_store(uri)
    dest_root = nodes / f"node-{rank}"
    dist.barrier()
    started = time.monotonic()
    parts: dict[str, float | None] = {}
    if leg in ("read_once", "kept"):
        copies = NodeCopies(nodes.parent / "copies" / f"node-{rank}") if leg == "kept" else None
        fetch = ResumeFetch(store, dest_root, copies=copies)
        point = fetch.wait()
        # Where the time goes: the share's download (in the background) and what wait() then took
        # (the exchange between the nodes, the hashing, the install).
        parts = {"share_read_s": fetch.fetch_s, "exchange_s": fetch.waited_s}
        if rank == 0:
            assert fetch.read is not None, "the nodes did not share the read"
            parts |= fetch.read.to_dict()
    else:
        point = fetch_resume_checkpoint(store, dest_root)
    assert point is not None
    assert point.step == 100, point
    dist.barrier()  # every node holds its verified copy
    seconds = time.monotonic() - started
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, parts)
    if rank == 0:
        out.write_text(json.dumps({"seconds": seconds, "per_node": every}))
    destroy_process_group()
