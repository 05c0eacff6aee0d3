"""A byte-level text corpus that needs no download: the Python docs shipped with the interpreter.

``pydoc_data.topics`` holds the language reference topics (about 460 KB of English and code). Bytes
are the tokens (vocabulary 256), so there is no tokenizer to fetch either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

VOCAB_SIZE = 256


def corpus_bytes() -> bytes:
    return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


class ByteBlocks(Dataset[dict[str, torch.Tensor]]):
    """Non-overlapping blocks of ``block_size`` bytes; the model shifts labels itself."""

    def __init__(self, data: bytes, block_size: int) -> None:
        usable = len(data) // block_size * block_size
        self.blocks = torch.frombuffer(bytearray(data[:usable]), dtype=torch.uint8).long().view(-1, block_size)

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block}


# MDS columns of the prepared dataset: a stable id per block (for the no-duplicate proof) and its bytes.
MDS_COLUMNS = {"sample_id": "int", "tokens": "ndarray:uint8"}


def mds_samples(block_size: int) -> Iterator[dict[str, Any]]:
    """The corpus as ``block_size``-byte blocks with stable ids, in corpus order (streaming shuffles)."""
    data = corpus_bytes()
    for index in range(len(data) // block_size):
        block = data[index * block_size : (index + 1) * block_size]
        yield {"sample_id": index, "tokens": np.frombuffer(block, dtype=np.uint8)}


def to_features(sample: dict[str, Any]) -> dict[str, torch.Tensor]:
    tokens = torch.as_tensor(np.asarray(sample["tokens"]), dtype=torch.long)
    return {"input_ids": tokens, "labels": tokens}
