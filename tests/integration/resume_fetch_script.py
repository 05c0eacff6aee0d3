"""Run by test_resume_fetch.py under torchrun: every rank fetches the checkpoint to resume from, as if
on two nodes (a copy each) and then as if on one (one shared copy), and writes the steps it ended with
to OUT/rank-<rank>.txt.

python -m torch.distributed.run --nproc-per-node 2 tests/integration/resume_fetch_script.py URI OUT
"""

import sys
from pathlib import Path

import torch.distributed as dist

from spotray.train.checkpoints.resume import ResumeFetch
from spotray.train.processes.ranks import destroy_process_group
from spotray.train.storage.store import open_store

if __name__ == "__main__":
    uri, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = []
    for dest_root in (out / f"node-{rank}", out / "shared-node"):
        point = ResumeFetch(open_store(uri), dest_root).wait()
        steps.append(str(point.step) if point else "none")
    (out / f"rank-{rank}.txt").write_text(" ".join(steps))
    destroy_process_group()
