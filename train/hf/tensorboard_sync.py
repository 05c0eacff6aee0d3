"""One TensorBoard run across attempts: the HF Trainer's event files kept next to the checkpoints.

With ``report_to=["tensorboard"]`` the Trainer's TensorBoard callback writes event files under
``args.logging_dir`` on rank 0, a new file each time a process starts. An attempt lost to a spot
reclaim takes its files with its node. ``TensorBoardSync`` puts them in the run's store
(``<checkpoint uri>/_spotray/tensorboard/<file>``) at every save and at the end of training, and at
the start of training fetches the earlier attempts' files into ``logging_dir``: pointed at that
directory (or at a copy of the prefix), TensorBoard shows one run. The steps an attempt trained
past its last checkpoint are trained again by the next one; a file whose steps start below an
earlier file's last step makes TensorBoard drop the earlier points above it (its purge of
orphaned data after a restart), so each step shows as trained by the attempt that kept it.

Best effort, like the progress object: a store that fails costs a warning, never a step. The
uploads are synchronous at a save (a few hundred KB for a long run's scalars); the files fetched
at the start are only names TensorBoard writes, each within ``MAX_EVENT_FILE_BYTES``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.contract.attempts import RECORDS_PREFIX
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)

PREFIX = f"{RECORDS_PREFIX}/tensorboard/"
# What TensorBoard's writers name their files (tensorboardX and torch.utils.tensorboard alike):
# nothing else is fetched, and no name with a path in it.
EVENT_FILE = re.compile(r"^events\.out\.tfevents\.[A-Za-z0-9._-]+$")
MAX_EVENT_FILE_BYTES = 256 << 20


class TensorBoardSync(TrainerCallback):
    """Keeps rank 0's TensorBoard event files under ``logging_dir`` in ``store`` (see the module docstring)."""

    def __init__(self, store: ObjectStore, logging_dir: Path) -> None:
        self.store = store
        self.logging_dir = Path(logging_dir)
        self.stored: dict[str, int] = {}  # file name -> the size last put in the store

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero:
            self.fetch()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.put()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero:
            self.put()

    def fetch(self) -> None:
        """The earlier attempts' event files into ``logging_dir`` (a file already there is kept)."""
        self.logging_dir.mkdir(parents=True, exist_ok=True)
        try:
            found = self.store.list(PREFIX)
            for info in found:
                name = info.key[len(PREFIX) :]
                if not EVENT_FILE.match(name) or info.size > MAX_EVENT_FILE_BYTES:
                    log.warning("not fetching %s: not a TensorBoard event file within bounds", info.key)
                    continue
                local = self.logging_dir / name
                if not local.exists():
                    local.write_bytes(self.store.get_bytes(info.key, max_bytes=MAX_EVENT_FILE_BYTES))
                self.stored[name] = info.size
        except Exception as error:  # noqa: BLE001 - the earlier curves are a view; training goes on without them
            log.warning("could not fetch the earlier attempts' TensorBoard logs: %s", error)
            return
        if found:
            log.info("TensorBoard: %d event file(s) of earlier attempts in %s", len(found), self.logging_dir)

    def put(self) -> None:
        """Every event file under ``logging_dir`` that grew since it was last put."""
        for path in sorted(self.logging_dir.glob("events.out.tfevents.*")):
            data = path.read_bytes()
            if not EVENT_FILE.match(path.name) or self.stored.get(path.name) == len(data):
                continue
            try:
                self.store.put_bytes(PREFIX + path.name, data)
            except Exception as error:  # noqa: BLE001 - best effort: the next save puts it again
                log.warning("could not put %s in the store: %s", path.name, error)
                continue
            self.stored[path.name] = len(data)
