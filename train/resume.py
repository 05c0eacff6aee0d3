"""Find and fetch the checkpoint to resume from.

The newest complete checkpoint is downloaded and verified; if its bytes turn out not to match the
manifest (bit rot, a bad copy), the next older complete one is tried, with a warning naming the one
skipped. No complete checkpoint means a fresh start.

``prefetch_in_background`` starts that download early, in the driver, when the workers will run on
the same machine: a worker's own fetch waits for it (``download_checkpoint`` locks the directory)
and reuses the verified copy.
"""

from __future__ import annotations

import logging
import threading
import time
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


def prefetch_in_background(store: ObjectStore, dest_root: Path) -> threading.Thread:
    """Fetch the checkpoint to resume from into ``dest_root`` in a background thread; best effort.

    A failure here is only logged: the workers fetch for themselves and report what goes wrong.
    """

    def prefetch() -> None:
        started = time.monotonic()
        try:
            point = fetch_resume_checkpoint(store, dest_root)
        except Exception as error:  # noqa: BLE001 - best effort: the workers' own fetch reports failures
            log.warning("prefetching the checkpoint to resume from failed (%s); the workers fetch it themselves", error)
            return
        if point is not None:
            log.info("prefetched checkpoint-%d into %s in %.1fs", point.step, dest_root, time.monotonic() - started)

    thread = threading.Thread(target=prefetch, name="spotray-resume-prefetch", daemon=True)
    thread.start()
    return thread
