"""MDS shards on a real S3 server, read back through spotray's streaming wrapper with an exact resume.

Marker `streaming`: needs the [streaming] extra. `make test-compat` also runs it with the
`streaming-community` fork (imported as the same `streaming`) in place of mosaicml-streaming, which
cannot install next to transformers 5: this is the test that decides whether the fork stands in.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from spotray.train.data import DataPosition, EpochLoader, open_streaming_dataset, write_mds_dataset
from spotray.train.local_s3 import LocalS3Server
from spotray.train.store import ObjectStore, parse_uri

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


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
