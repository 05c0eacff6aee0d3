"""Ten classes of small grayscale images drawn from a seed, stored as Parquet in the data store.

No download and no dataset package: each class is a pattern (stripes in four directions, a
checkerboard, a disk, a ring, a plus, a cross, a square outline) drawn with a random size, position,
period and contrast, then buried in Gaussian noise, so that a small CNN has something to learn.
The same seed (and numpy version) gives the same images.

Preparation writes Parquet files and uploads them through our store, ``dataset.json`` last: like a
checkpoint manifest, its presence means the dataset is complete, and a preparation cut short is
redone, never read half-way. It also names the files, so training reads exactly those.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from spotray.contract.errors import SpotrayError
from spotray.train.storage.store import ObjectStore

MARKER_NAME = "dataset.json"
CLASS_NAMES = (
    "horizontal stripes",
    "vertical stripes",
    "diagonal stripes",
    "anti-diagonal stripes",
    "checkerboard",
    "disk",
    "ring",
    "plus",
    "cross",
    "square outline",
)
NUM_CLASSES = len(CLASS_NAMES)

Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]
Grid = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ShapesSpec:
    """What to generate; stored in ``dataset.json`` so a dataset made differently is not mistaken for this one."""

    image_size: int = 16
    samples_per_class: int = 300
    noise: float = 0.35
    seed: int = 1234

    @property
    def num_samples(self) -> int:
        return self.samples_per_class * NUM_CLASSES


Mask = npt.NDArray[np.bool_]


def _stripes(rows: Grid, cols: Grid, rng: np.random.Generator, direction: int) -> Mask:
    coordinate = (rows, cols, rows + cols, rows - cols)[direction]
    period = rng.uniform(3.0, 6.0)
    mask: Mask = np.sin(2 * np.pi * coordinate / period + rng.uniform(0, 2 * np.pi)) > 0
    return mask


def _draw(label: int, size: int, rng: np.random.Generator) -> Mask:
    """One clean pattern of class ``label``: where it is on."""
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float32)
    if label < 4:
        return _stripes(rows, cols, rng, label)
    mask: Mask
    if label == 4:
        cell = int(rng.integers(2, 5))
        offset = rng.integers(0, cell, size=2)
        mask = ((rows + offset[0]) // cell + (cols + offset[1]) // cell) % 2 == 1
        return mask
    # Shapes: a random centre away from the edges and a random size.
    centre = rng.uniform(size * 0.35, size * 0.65, size=2)
    dr, dc = rows - centre[0], cols - centre[1]
    extent = rng.uniform(size * 0.2, size * 0.35)
    width = max(1.0, size / 12)
    if label == 5:
        mask = np.hypot(dr, dc) <= extent
    elif label == 6:
        mask = np.abs(np.hypot(dr, dc) - extent) <= width
    elif label == 7:
        mask = ((np.abs(dr) <= width) & (np.abs(dc) <= extent)) | ((np.abs(dc) <= width) & (np.abs(dr) <= extent))
    elif label == 8:
        near_diagonal = (np.abs(dr - dc) <= width * 1.4) | (np.abs(dr + dc) <= width * 1.4)
        mask = near_diagonal & (np.maximum(np.abs(dr), np.abs(dc)) <= extent)
    else:
        chebyshev = np.maximum(np.abs(dr), np.abs(dc))
        mask = np.abs(chebyshev - extent) <= width
    return mask


def generate(spec: ShapesSpec) -> tuple[Images, Labels]:
    """``(images, labels)``: float32 ``(N, 1, S, S)`` roughly in [-1, 2], int64 ``(N,)``, classes balanced, shuffled."""
    rng = np.random.default_rng(spec.seed)
    labels: Labels = np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), spec.samples_per_class)
    rng.shuffle(labels)  # mixed classes in every file and every batch, before any reader shuffles
    images: Images = np.empty((len(labels), 1, spec.image_size, spec.image_size), dtype=np.float32)
    for index, label in enumerate(labels):
        contrast = rng.uniform(0.6, 1.0)
        clean = _draw(int(label), spec.image_size, rng) * contrast
        images[index, 0] = clean + rng.normal(0.0, spec.noise, size=clean.shape)
    return images, labels


def to_table(images: Images, labels: Labels) -> pa.Table:
    """Images as fixed-size lists of float32 (flattened), which Ray Data hands to torch as one tensor per batch."""
    flat = pa.array(images.reshape(len(images), -1).ravel(), type=pa.float32())
    pixels = pa.FixedSizeListArray.from_arrays(flat, images[0].size)
    return pa.table({"image": pixels, "label": pa.array(labels, type=pa.int64())})


@dataclass(frozen=True)
class DatasetInfo:
    """The contents of ``dataset.json``: how the data was made and which files hold it."""

    spec: ShapesSpec
    files: list[str]

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DatasetInfo:
        raw = json.loads(data)
        return cls(spec=ShapesSpec(**raw["spec"]), files=[str(name) for name in raw["files"]])


def read_dataset_info(store: ObjectStore) -> DatasetInfo | None:
    """The dataset at ``store``'s root, or None when there is no complete one."""
    if not any(info.key == MARKER_NAME for info in store.list(MARKER_NAME)):
        return None
    return DatasetInfo.from_json(store.get_bytes(MARKER_NAME))


def write_dataset(store: ObjectStore, spec: ShapesSpec, *, files: int = 4) -> DatasetInfo:
    """Generate the images and upload them as Parquet, the marker last.

    Several files rather than one, so that Ray Data reads them in parallel and each worker's shard
    is fed as soon as possible.
    """
    images, labels = generate(spec)
    names = [f"part-{index:05d}.parquet" for index in range(files)]
    with tempfile.TemporaryDirectory(prefix="spotray-cnn-") as tmp:
        pairs = []
        for name, rows in zip(names, np.array_split(np.arange(len(labels)), files), strict=True):
            path = Path(tmp) / name
            pq.write_table(to_table(images[rows], labels[rows]), path)
            pairs.append((path, name))
        store.upload_files(pairs)
    info = DatasetInfo(spec=spec, files=names)
    store.put_bytes(MARKER_NAME, info.to_json())
    return info


def ensure_dataset(store: ObjectStore, spec: ShapesSpec) -> tuple[DatasetInfo, bool]:
    """The complete dataset in ``store``, and whether it was written now (there was none yet)."""
    info = read_dataset_info(store)
    if info is None:
        return write_dataset(store, spec), True
    if info.spec != spec:
        raise SpotrayError(
            f"the dataset in {store.uri} was generated with {info.spec}, not {spec}",
            "give this job its own data URI (spec.data.uri or --data-uri), or delete that prefix",
        )
    return info, False
