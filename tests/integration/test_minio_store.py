"""spotray's S3 store against a real MinIO (the chart's in-cluster store), not only SeaweedFS.

MinIO is stricter about object names: a key with an empty path segment ("a//b") is refused with
XMinioInvalidObjectName, where SeaweedFS folds it. Found on real pods, where the GPT-2 job wrote
its dataset into the chart's MinIO.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from spotray.train.storage.mds_dataset import INDEX_NAME, write_mds_dataset
from spotray.train.storage.store import download_dir, upload_dir
from tests.minio import ROOT_PASSWORD, ROOT_USER, Minio, minio_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Minio:  # type: ignore[misc]
    with minio_server(tmp_path_factory.mktemp("minio")) as server:
        boto3.client(
            "s3", endpoint_url=server.url, aws_access_key_id=ROOT_USER, aws_secret_access_key=ROOT_PASSWORD,
            region_name="us-east-1",
        ).create_bucket(Bucket="spotray")  # fmt: skip
        yield server


def test_a_dataset_written_at_the_store_root_lands_under_its_prefix(minio: Minio) -> None:
    store = minio.store("s3://spotray/datasets/tokens", ROOT_USER, ROOT_PASSWORD)
    samples = ({"tokens": bytes([i % 256]) * 64} for i in range(100))
    assert write_mds_dataset(store, samples, {"tokens": "bytes"}) == 100
    keys = sorted(info.key for info in store.list(""))
    assert INDEX_NAME in keys
    assert all(not key.startswith("/") and "//" not in key for key in keys), keys


def test_a_directory_uploaded_and_downloaded_at_the_store_root(minio: Minio, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"a")
    (source / "sub" / "b.bin").write_bytes(b"b")
    store = minio.store("s3://spotray/dirs/one", ROOT_USER, ROOT_PASSWORD)
    assert upload_dir(store, source, "") == ["a.bin", "sub/b.bin"]
    assert sorted(download_dir(store, "", tmp_path / "back")) == ["a.bin", "sub/b.bin"]
    assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == b"b"
