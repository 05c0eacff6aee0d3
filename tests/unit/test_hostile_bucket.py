"""A bucket written by someone hostile: manifest names that leave the checkpoint, and huge records.

Object keys on AWS S3 may hold `..` segments and `//` (an absolute name after the prefix), and a
listing returns them as they are. SeaweedFS refuses such keys and the `file://` store resolves
them as paths (../shared/ENV.md), so no real server here can hold them: `AwsKeyStore` is an
in-memory store with AWS's key semantics, the one fault injected by hand in this file.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import ObjectTooLargeError
from spotray.contract.uris import StorageUri, parse_uri
from spotray.train.checkpoints.checkpoint import MANIFEST_FORMAT, MANIFEST_NAME, MAX_MANIFEST_BYTES, list_checkpoints
from spotray.train.storage.store import ObjectInfo, get_bytes_if_exists
from tests.hostile import resume_skips_the_escaping_checkpoint

pytestmark = [pytest.mark.unit, pytest.mark.core]

PAYLOAD = b"written by whoever can write to the bucket\n"


class AwsKeyStore:
    """Keys kept exactly as written, as AWS S3 keeps them."""

    def __init__(self) -> None:
        self.uri: StorageUri = parse_uri("s3://shared-bucket/runs/victim")
        self.checkpoint_key: CheckpointKey | None = None
        self.objects: dict[str, bytes] = {}

    def check(self, *, create_bucket: bool = False) -> None:
        return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return [ObjectInfo(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix)]

    def put_bytes(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        data = self.objects[key]
        if max_bytes is not None and len(data) > max_bytes:
            raise ObjectTooLargeError.for_object(str(self.uri.join(key)), max_bytes)
        return data

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        for path, key in pairs:
            self.objects[key] = path.read_bytes()

    def download_files(self, pairs: Sequence[tuple[str, Path]]) -> dict[Path, str]:
        for key, path in pairs:  # what an S3 download does: write to the path it is given
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.objects[key])
        return {path: hashlib.sha256(self.objects[key]).hexdigest() for key, path in pairs}

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.objects.pop(key, None)


def plant_checkpoint(store: AwsKeyStore, step: int, names: list[str]) -> None:
    prefix = f"checkpoint-{step}"
    files = {}
    for name in names:
        store.objects[f"{prefix}/{name}"] = PAYLOAD
        files[name] = {"size": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest()}
    manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": 1, "files": files, "created_at": time.time()}
    store.objects[f"{prefix}/{MANIFEST_NAME}"] = json.dumps(manifest).encode()


@pytest.mark.parametrize(
    "escaping_name",
    ["../../../escaped.txt", "/{tmp}/absolute.txt", "a/../../../../escaped.txt", "./model.safetensors", "a\\..\\b"],
)
def test_a_manifest_naming_a_file_outside_its_checkpoint_is_never_complete_nor_downloaded(
    tmp_path: Path, escaping_name: str
) -> None:
    escaping_name = escaping_name.format(tmp=str(tmp_path).strip("/"))
    store = AwsKeyStore()
    plant_checkpoint(store, 10, ["model.safetensors"])  # an honest older checkpoint
    plant_checkpoint(store, 20, ["model.safetensors", escaping_name])
    assert "outside its checkpoint" in resume_skips_the_escaping_checkpoint(store, tmp_path, escaping_name)


def test_a_huge_manifest_is_not_read_into_memory() -> None:
    store = AwsKeyStore()
    plant_checkpoint(store, 30, ["model.safetensors"])
    store.objects[f"checkpoint-30/{MANIFEST_NAME}"] = b" " * (MAX_MANIFEST_BYTES + 1)

    (info,) = list_checkpoints(store)
    assert not info.complete
    assert info.problem is not None
    assert f"more than the {MAX_MANIFEST_BYTES} bytes" in info.problem


def test_a_huge_record_is_refused_with_a_message_that_names_it() -> None:
    store = AwsKeyStore()
    store.objects["_spotray/attempt-1.json"] = b"{" + b" " * 2048 + b"}"
    with pytest.raises(ObjectTooLargeError) as caught:
        get_bytes_if_exists(store, "_spotray/attempt-1.json", max_bytes=1024)
    assert "s3://shared-bucket/runs/victim/_spotray/attempt-1.json" in str(caught.value)
    assert "who can write to the bucket" in str(caught.value)
