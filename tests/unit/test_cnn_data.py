"""The CNN job's generated images: the same for the same seed, the right shapes, every class equally often."""

import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from spotray.contract.errors import SpotrayError
from spotray.jobs.cnn.data import MARKER_NAME, NUM_CLASSES, DatasetInfo, ShapesSpec, ensure_dataset, generate, to_table
from spotray.train.storage.store import open_store

pytestmark = pytest.mark.unit

SMALL = ShapesSpec(samples_per_class=20)


def test_same_seed_same_images() -> None:
    images, labels = generate(SMALL)
    again_images, again_labels = generate(SMALL)
    np.testing.assert_array_equal(images, again_images)
    np.testing.assert_array_equal(labels, again_labels)


def test_another_seed_other_images() -> None:
    images, _ = generate(SMALL)
    other, _ = generate(ShapesSpec(samples_per_class=20, seed=SMALL.seed + 1))
    assert not np.array_equal(images, other)


@pytest.mark.parametrize("image_size", [16, 28])
def test_shapes_and_types(image_size: int) -> None:
    spec = ShapesSpec(image_size=image_size, samples_per_class=5)
    images, labels = generate(spec)
    assert images.shape == (spec.num_samples, 1, image_size, image_size)
    assert images.dtype == np.float32
    assert labels.shape == (spec.num_samples,)
    assert labels.dtype == np.int64
    assert np.isfinite(images).all()


def test_labels_balanced_and_shuffled() -> None:
    _, labels = generate(SMALL)
    assert np.bincount(labels, minlength=NUM_CLASSES).tolist() == [20] * NUM_CLASSES
    # Shuffled, not in class order: any file or batch holds a mix of classes.
    assert len(set(labels[: NUM_CLASSES * 2].tolist())) > NUM_CLASSES // 2


def test_classes_differ_beyond_the_noise() -> None:
    """The class means are far apart relative to the noise: there is something for the CNN to learn."""
    images, labels = generate(ShapesSpec(samples_per_class=200, noise=0.35))
    means = np.stack([images[labels == label].mean(axis=0).ravel() for label in range(NUM_CLASSES)])
    distances = np.linalg.norm(means[:, None] - means[None], axis=-1)
    off_diagonal = distances[~np.eye(NUM_CLASSES, dtype=bool)]
    assert off_diagonal.min() > 0.5


def test_parquet_round_trip() -> None:
    images, labels = generate(ShapesSpec(samples_per_class=3))
    buffer = io.BytesIO()
    pq.write_table(to_table(images, labels), buffer)
    table = pq.read_table(io.BytesIO(buffer.getvalue()))
    assert table.column_names == ["image", "label"]
    pixels = np.stack(table.column("image").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(pixels.reshape(images.shape), images)
    np.testing.assert_array_equal(table.column("label").to_numpy(), labels)


def test_marker_round_trip() -> None:
    info = DatasetInfo(spec=SMALL, files=["part-00000.parquet", "part-00001.parquet"])
    assert DatasetInfo.from_json(info.to_json()) == info


def test_dataset_is_written_once_marker_last(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    info, written = ensure_dataset(store, SMALL)
    assert written
    keys = [o.key for o in store.list()]
    assert sorted(keys) == sorted([*info.files, MARKER_NAME])
    table = pq.read_table(tmp_path / info.files[0])
    assert table.num_rows == SMALL.num_samples // len(info.files)
    assert ensure_dataset(store, SMALL) == (info, False)


def test_half_written_dataset_is_written_again(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    (tmp_path / "part-00000.parquet").write_bytes(b"cut off")  # a preparation killed before its marker
    info, written = ensure_dataset(store, SMALL)
    assert written
    assert pq.read_table(tmp_path / info.files[0]).num_rows > 0


def test_dataset_made_differently_is_refused(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    ensure_dataset(store, SMALL)
    with pytest.raises(SpotrayError, match="give this job its own data URI"):
        ensure_dataset(store, ShapesSpec(samples_per_class=30))
