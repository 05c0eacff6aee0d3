"""Run by test_async_checkpoint.py under torchrun: DDP trainings (2 CPU processes, gloo) that save twice,
one per MODE, each in ROOT/MODE, one after the other in the same processes (a torchrun start costs
seconds: two imports of torch and transformers per rank).

python -m torch.distributed.run --nproc-per-node 2 tests/integration/ddp_checkpoint_script.py ROOT MODE...
"""

import sys
from pathlib import Path

import torch.distributed as dist
from transformers import Trainer

from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
from spotray.train.processes.ranks import destroy_process_group
from tests.integration.test_async_checkpoint import make_trainer, sync_callback

if __name__ == "__main__":
    root, modes = Path(sys.argv[1]), sys.argv[2:]
    for mode in modes:
        trainer_class = AsyncSaveTrainer if mode == "async" else Trainer
        sync = sync_callback(root / mode, async_save=mode == "async")
        trainer = make_trainer(trainer_class, root / mode, [sync])  # seeded: each mode starts alike
        trainer.train()
        assert trainer.args.world_size == 2, "not a DDP run"
        if mode == "async" and trainer.args.process_index == 0:
            assert sync.snapshot_writer is not None
            assert sync.snapshot_writer.buffers.nbytes > 0, "the Trainer saved synchronously"
        # Both ranks finish a mode together before the next starts.
        dist.barrier()
    # The process group is destroyed before the interpreter is: a rank that exits while the other
    # still uploads (rank 0 in async mode) otherwise risks a SIGABRT in gloo's teardown ("terminate
    # called without an active exception"; seen once in CI, rank 1). jobs/gpt2/train.py does the same,
    # through the same helper (it steps around torch 2.6's teardown deadlock).
    destroy_process_group()
