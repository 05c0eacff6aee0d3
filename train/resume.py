"""Find and fetch the checkpoint to resume from.

The newest complete checkpoint is downloaded and verified; if its bytes turn out not to match the
manifest (bit rot, a bad copy), the next older complete one is tried, with a warning naming the one
skipped. No complete checkpoint means a fresh start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from spotray.train.checkpoint import Manifest, complete_checkpoints, download_checkpoint, manifest_exists
from spotray.train.errors import CorruptCheckpointError, StoreRequestError
from spotray.train.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """A verified local copy of a complete checkpoint: pass ``local_dir`` to ``Trainer.train``."""

    step: int
    local_dir: Path
    manifest: Manifest
    uri: str


def fetch_resume_checkpoint(store: ObjectStore, dest_root: Path) -> ResumePoint | None:
    """Download the newest complete checkpoint that verifies into ``dest_root``; None if there is none."""
    for info in complete_checkpoints(store):
        assert info.manifest is not None  # complete implies a parsed manifest
        try:
            local_dir = download_checkpoint(store, info, dest_root)
        except CorruptCheckpointError as error:
            log.warning("skipping %s: %s", store.uri.join(info.prefix), error.problem)
            continue
        except (StoreRequestError, FileNotFoundError):
            if manifest_exists(store, info.prefix):
                raise  # still there: a real fault, not a race with a prune
            log.info("skipping %s: deleted while being downloaded (pruned meanwhile)", store.uri.join(info.prefix))
            continue
        return ResumePoint(info.step, local_dir, info.manifest, str(store.uri.join(info.prefix)))
    return None
