"""Run by test_process_group_teardown.py under torchrun: leave the process group while gloo's thread
still holds the last reference to a collective's tensor, and write OUT/rank-<rank>.txt once out.

python -m torch.distributed.run --nproc-per-node 2 tests/integration/teardown_script.py OUT
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from spotray.train.processes.ranks import destroy_process_group

if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.zeros(1 << 16)
    work = dist.broadcast(tensor, src=0, async_op=True)
    # Only gloo's thread holds the tensor now: it frees it, taking the GIL, once the broadcast is done.
    del tensor, work
    destroy_process_group()
    (out / f"rank-{rank}.txt").write_text("left the process group")
