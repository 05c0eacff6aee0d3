"""A dataset as MosaicML MDS shards in a store, written once: ``index.json`` last, so its presence
means the dataset is complete and a preparation cut short is redone, never read half-way.

Light on purpose (no torch, no transformers): a job's driver prepares the dataset before its workers
start, and what the driver imports is start-up time on every attempt (issue 39). Training reads the
shards with train/hf/data.py.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from spotray.contract.extras import extra_required
from spotray.train.storage.store import ObjectStore, upload_dir

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"


def dataset_is_complete(store: ObjectStore) -> bool:
    return any(info.key == INDEX_NAME for info in store.list(INDEX_NAME))


def write_mds_dataset(
    store: ObjectStore, samples: Iterable[dict[str, Any]], columns: dict[str, str], *, shard_bytes: int = 1 << 22
) -> int:
    """Write ``samples`` as MDS shards to ``store``'s prefix, ``index.json`` last; return the sample count."""
    with extra_required("streaming"):
        from streaming import MDSWriter  # noqa: PLC0415 (imports torchvision: only when preparing data)

    with tempfile.TemporaryDirectory(prefix="spotray-mds-") as tmp:
        local = Path(tmp) / "mds"
        count = 0
        with MDSWriter(out=str(local), columns=columns, size_limit=shard_bytes) as writer:
            for sample in samples:
                writer.write(sample)
                count += 1
        upload_dir(store, local, "", exclude=(INDEX_NAME,))
        store.upload_files([(local / INDEX_NAME, INDEX_NAME)])
    return count


def ensure_dataset(
    store: ObjectStore, make_samples: Callable[[], Iterable[dict[str, Any]]], columns: dict[str, str]
) -> bool:
    """Prepare the dataset unless a complete one is already there; True when it was written now."""
    if dataset_is_complete(store):
        return False
    count = write_mds_dataset(store, make_samples(), columns)
    log.info("wrote %d samples as MDS shards to %s", count, store.uri)
    return True
