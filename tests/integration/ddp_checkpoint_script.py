"""Run by test_async_checkpoint.py under torchrun: one DDP training (2 CPU processes, gloo) that saves twice.

python -m torch.distributed.run --nproc-per-node 2 tests/integration/ddp_checkpoint_script.py WORKDIR MODE
"""

import sys
from pathlib import Path

import torch.distributed as dist
from transformers import Trainer

from spotray.train.async_checkpoint import AsyncSaveTrainer
from tests.integration.test_async_checkpoint import make_trainer, sync_callback

if __name__ == "__main__":
    workdir, mode = Path(sys.argv[1]), sys.argv[2]
    trainer_class = AsyncSaveTrainer if mode == "async" else Trainer
    sync = sync_callback(workdir, async_save=mode == "async")
    trainer = make_trainer(trainer_class, workdir, [sync])
    trainer.train()
    assert trainer.args.world_size == 2, "not a DDP run"
    if mode == "async" and trainer.args.process_index == 0:
        assert sync.snapshot_writer is not None
        assert sync.snapshot_writer.buffers.nbytes > 0, "the Trainer saved synchronously"
    # Both ranks leave together, and the process group is destroyed before the interpreter is: a rank
    # that exits while the other still uploads (rank 0 in async mode) otherwise risks a SIGABRT in
    # gloo's teardown ("terminate called without an active exception"; seen once in CI, rank 1).
    # jobs/gpt2/train.py does the same.
    dist.barrier()
    dist.destroy_process_group()
