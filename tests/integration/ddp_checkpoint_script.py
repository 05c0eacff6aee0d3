"""Run by test_async_checkpoint.py under torchrun: one DDP training (2 CPU processes, gloo) that saves twice.

python -m torch.distributed.run --nproc-per-node 2 tests/integration/ddp_checkpoint_script.py WORKDIR MODE
"""

import sys
from pathlib import Path

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
