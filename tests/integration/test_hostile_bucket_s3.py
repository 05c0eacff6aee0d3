"""A hostile bucket on a real S3 server (SeaweedFS): what tests/unit/test_hostile_bucket.py checks
with an in-memory store, here where the bytes come over HTTP.

- A manifest naming a file outside its checkpoint: the checkpoint is not complete, a resume takes
  the honest older one, and nothing is written outside the destination. (SeaweedFS cannot hold a key
  with `..`, so the escaping file itself is not there; the manifest alone must be refused.)
- A manifest far past its bound: refused, and never read whole into memory (the peak of Python's
  allocations while listing stays near the bound, not the object's size).
- An attempt record past its bound: refused with a message that names the object.
"""

from __future__ import annotations

import hashlib
import json
import time
import tracemalloc
from pathlib import Path

import pytest

from spotray.contract.attempts import MAX_RECORD_BYTES
from spotray.contract.errors import ObjectTooLargeError
from spotray.train.checkpoints.checkpoint import MANIFEST_FORMAT, MANIFEST_NAME, MAX_MANIFEST_BYTES, list_checkpoints
from spotray.train.storage.store import S3ObjectStore, get_bytes_if_exists
from tests.hostile import resume_skips_the_escaping_checkpoint

pytestmark = pytest.mark.integration

PAYLOAD = b"written by whoever can write to the bucket\n"


def plant_checkpoint(store: S3ObjectStore, step: int, names: list[str], present: list[str]) -> None:
    """A manifest listing ``names``; of those, the objects in ``present`` are uploaded."""
    files = {name: {"size": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest()} for name in names}
    for name in present:
        store.put_bytes(f"checkpoint-{step}/{name}", PAYLOAD)
    manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": 1, "files": files, "created_at": time.time()}
    store.put_bytes(f"checkpoint-{step}/{MANIFEST_NAME}", json.dumps(manifest).encode())


@pytest.mark.parametrize("escaping_name", ["../../../escaped.txt", "/{tmp}/absolute.txt", "a/../../../../escaped.txt"])
def test_a_manifest_naming_a_file_outside_its_checkpoint_is_refused_by_a_resume_from_a_real_server(
    s3_store: S3ObjectStore, tmp_path: Path, escaping_name: str
) -> None:
    escaping_name = escaping_name.format(tmp=str(tmp_path).strip("/"))
    plant_checkpoint(s3_store, 10, ["model.safetensors"], ["model.safetensors"])
    plant_checkpoint(s3_store, 20, ["model.safetensors", escaping_name], ["model.safetensors"])
    # Refused for its name, before anyone looks for the file (which SeaweedFS could not hold).
    assert "outside its checkpoint" in resume_skips_the_escaping_checkpoint(s3_store, tmp_path, escaping_name)


def test_a_huge_manifest_is_refused_without_being_read_into_memory(s3_store: S3ObjectStore) -> None:
    plant_checkpoint(s3_store, 30, ["model.safetensors"], ["model.safetensors"])
    huge = 4 * MAX_MANIFEST_BYTES
    s3_store.put_bytes(f"checkpoint-30/{MANIFEST_NAME}", b" " * huge)

    tracemalloc.start()
    try:
        (info,) = list_checkpoints(s3_store)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not info.complete
    assert info.problem is not None
    assert f"more than the {MAX_MANIFEST_BYTES} bytes" in info.problem
    assert peak < 2 * MAX_MANIFEST_BYTES, f"{peak} bytes held for a {huge}-byte manifest"


def test_a_huge_record_is_refused_with_a_message_that_names_it(s3_store: S3ObjectStore) -> None:
    s3_store.put_bytes("_spotray/attempt-1.json", b"{" + b" " * MAX_RECORD_BYTES + b"}")
    with pytest.raises(ObjectTooLargeError) as caught:
        get_bytes_if_exists(s3_store, "_spotray/attempt-1.json")
    assert f"{s3_store.uri}/_spotray/attempt-1.json" in str(caught.value)
    assert "who can write to the bucket" in str(caught.value)
