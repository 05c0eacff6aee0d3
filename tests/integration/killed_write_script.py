"""Run by test_async_checkpoint.py: train with async saves whose write of checkpoint-6 stalls half-way.

    python tests/integration/killed_write_script.py WORKDIR

checkpoint-3 is written and uploaded normally. The write of checkpoint-6 stops after its model
file (a disk that hangs); the test kills the process there, so the kill lands inside the
background write, a window only the async path has.
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path

from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer, HostBuffers
from tests.integration.test_async_checkpoint import make_trainer, sync_callback


class StallingWriteTrainer(AsyncSaveTrainer):
    def _capture(self, buffers: HostBuffers, output_dir: Path) -> Callable[[], None]:
        write = super()._capture(buffers, output_dir)
        if not output_dir.name.endswith("-6"):
            return write

        def stalling_write() -> None:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._save(str(output_dir), state_dict=buffers.copy("model", self.model.state_dict()))
            print("STALLED", flush=True)
            time.sleep(600)
            write()

        return stalling_write


if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    make_trainer(StallingWriteTrainer, workdir, [sync_callback(workdir, async_save=True)], max_steps=9).train()
