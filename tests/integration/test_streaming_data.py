"""MDS shards on a real S3 server, read back through spotray's streaming wrapper with an exact resume.

Marker `streaming`: needs the [streaming] extra. `make test-compat` also runs it with the
`streaming-community` fork (imported as the same `streaming`) in place of mosaicml-streaming, which
cannot install next to transformers 5: this is the test that decides whether the fork stands in.
"""

from __future__ import annotations

import importlib.metadata
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from spotray.contract.uris import parse_uri
from spotray.train.hf.data import DataPosition, EpochLoader, open_streaming_dataset
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.mds_dataset import write_mds_dataset
from spotray.train.storage.store import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.streaming]

SAMPLES = 96
BATCH = 4


def ids_of(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {"ids": torch.tensor([int(sample["sample_id"]) for sample in samples])}


def epoch_ids(uri: str, cache: Path, start: DataPosition, batches: int | None = None) -> tuple[list[int], DataPosition]:
    dataset = open_streaming_dataset(parse_uri(uri), cache, batch_size=BATCH, position=start)
    loader = EpochLoader(dataset, batch_size=BATCH, world_size=1, start=start, collate_fn=ids_of)
    seen: list[int] = []
    for index, batch in enumerate(loader):
        seen += batch["ids"].tolist()
        if batches is not None and index + 1 == batches:
            break
    return seen, loader.position


def test_a_resumed_epoch_continues_the_exact_sample_order(
    s3_server: LocalS3Server, s3_store: ObjectStore, s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)  # streaming reads its S3 endpoint and keys from the environment
    written = write_mds_dataset(s3_store, ({"sample_id": i} for i in range(SAMPLES)), {"sample_id": "int"})
    assert written == SAMPLES

    uninterrupted, _ = epoch_ids(s3_uri, tmp_path / "cache-a", DataPosition())
    assert sorted(uninterrupted) == list(range(SAMPLES)), "one epoch is every sample once"
    assert uninterrupted != list(range(SAMPLES)), "shuffled"

    before, position = epoch_ids(s3_uri, tmp_path / "cache-b", DataPosition(), batches=7)
    assert position == DataPosition(epoch=0, sample_in_epoch=7 * BATCH)
    after, _ = epoch_ids(s3_uri, tmp_path / "cache-c", position)
    assert before + after == uninterrupted, "the resumed reader continues exactly where the first stopped"
    distribution = next(
        (d for d in ("mosaicml-streaming", "streaming-community") if _installed(d)), "no streaming distribution"
    )
    print(f"streaming from {distribution}: exact resume after {len(before)} of {SAMPLES} samples")


def test_a_reader_resumed_at_an_epochs_end_goes_on_with_the_next_epochs_order(
    s3_server: LocalS3Server, s3_store: ObjectStore, s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The position a save on an epoch's last batch records (every sample of the epoch handed out) resumes
    with the next epoch, in the order an uninterrupted reader has there: streaming's resumed epoch gives no
    batch, and the Trainer would take that for the end of the data (tests/unit/test_streaming_trainer.py)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    write_mds_dataset(s3_store, ({"sample_id": i} for i in range(SAMPLES)), {"sample_id": "int"})
    dataset = open_streaming_dataset(parse_uri(s3_uri), tmp_path / "cache-a", batch_size=BATCH, position=DataPosition())
    loader = EpochLoader(dataset, batch_size=BATCH, world_size=1, start=DataPosition(), collate_fn=ids_of)
    first_epoch = [batch["ids"].tolist() for batch in loader]
    assert loader.position == DataPosition(0, SAMPLES)  # what a save on the epoch's last batch records
    second_epoch = [batch["ids"].tolist() for _, batch in zip(range(3), loader, strict=False)]
    assert len(first_epoch) == SAMPLES // BATCH
    assert second_epoch != first_epoch[:3], "the next epoch has an order of its own"

    resumed_from = DataPosition(0, SAMPLES)
    dataset = open_streaming_dataset(parse_uri(s3_uri), tmp_path / "cache-b", batch_size=BATCH, position=resumed_from)
    resumed = EpochLoader(dataset, batch_size=BATCH, world_size=1, start=resumed_from, collate_fn=ids_of)
    after = [batch["ids"].tolist() for _, batch in zip(range(3), resumed, strict=False)]
    assert after == second_epoch
    assert resumed.position == DataPosition(1, 3 * BATCH)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# A reader SIGKILLed with its process group, as a Ray Train worker lost during start-up (a preemption)
# is: no atexit handler runs, and Python's resource tracker (the child that would unlink the segments
# the reader created) dies with it, as Ray kills a dead worker's child processes.
# "registered": killed inside StreamingDataset's constructor, after it
# registered its shared-memory prefix and before it made that prefix's file locks (the call below is
# the constructor's own first step); "one-batch": killed after reading a batch; "exit": ends normally.
READER = """
import os, signal, sys
from pathlib import Path
from spotray.train.hf.data import DataPosition, EpochLoader, open_streaming_dataset
from spotray.train.storage.store import parse_uri
uri, cache, how = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if how == "registered":
    from streaming.base.shared.prefix import get_shm_prefix
    from streaming.base.world import World
    get_shm_prefix([str(cache)], [uri], World.detect())
    os.killpg(0, signal.SIGKILL)
dataset = open_streaming_dataset(parse_uri(uri), cache, batch_size=4, position=DataPosition())
next(iter(EpochLoader(dataset, batch_size=4, world_size=1, start=DataPosition(), collate_fn=lambda samples: samples)))
if how == "one-batch":
    os.killpg(0, signal.SIGKILL)
"""


def read_in_subprocess(uri: str, cache: Path, how: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", READER, uri, str(cache), how],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )


def streaming_registrations_of(cache: Path) -> list[str]:
    """The /dev/shm entries streaming registered for ``cache`` (its LOCALS segments) that still exist."""
    found = []
    for entry in Path("/dev/shm").glob("*_locals"):
        try:
            if str(cache).encode() in entry.read_bytes():
                found.append(entry.name)
        except OSError:
            continue  # another user's, or gone meanwhile
    return found


def test_readers_killed_one_after_another_leave_nothing_the_next_trips_over(
    s3_server: LocalS3Server, s3_store: ObjectStore, s3_uri: str, tmp_path: Path, s3_env: dict[str, str]
) -> None:
    write_mds_dataset(s3_store, ({"sample_id": i} for i in range(SAMPLES)), {"sample_id": "int"})
    # Named for this run: the "registered" reader calls streaming's own registration, which refuses a
    # path an earlier, interrupted run of this test left registered (pytest's tmp paths repeat).
    cache = tmp_path / f"mds-cache-{uuid.uuid4().hex[:8]}"
    for how in ("registered", "one-batch"):
        killed = read_in_subprocess(s3_uri, cache, how, s3_env)
        assert killed.returncode == -signal.SIGKILL, f"a reader ({how}) died of its own error:\n{killed.stderr[-3000:]}"
        assert streaming_registrations_of(cache), "the killed reader left its shared memory (the fault is real)"
    survivor = read_in_subprocess(s3_uri, cache, "exit", s3_env)
    assert survivor.returncode == 0, survivor.stderr[-3000:]
    assert streaming_registrations_of(cache) == [], "the survivor released what the dead readers left, and its own"
