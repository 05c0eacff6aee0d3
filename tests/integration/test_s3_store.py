"""The S3 client against a real SeaweedFS server: transfers, listing, and the errors users hit."""

import hashlib
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotray.contract.errors import BucketMissingError, StoreCredentialsError, StoreUnreachableError
from spotray.contract.uris import parse_uri
from spotray.train.storage.local_s3 import LocalS3Server, free_port
from spotray.train.storage.store import (
    RetryPolicy,
    S3ObjectStore,
    StoreConfig,
    download_dir,
    make_s3_client,
    upload_dir,
)
from tests.conftest import TEST_BUCKET, write_files

pytestmark = [pytest.mark.integration, pytest.mark.core]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_directory_round_trip_keeps_every_byte(s3_store: S3ObjectStore, tmp_path: Path) -> None:
    files = {
        "model.safetensors": os.urandom(40 * 1024 * 1024 + 123),  # multipart
        "optimizer.pt": os.urandom(3 * 1024 * 1024),
        "nested/deeper/rng_state.pth": os.urandom(1000),
        "empty.txt": b"",
    }
    source = write_files(tmp_path / "src", files)
    sent = upload_dir(s3_store, source, "ckpt")
    assert sorted(sent) == sorted(files)
    listed = {o.key: o.size for o in s3_store.list("ckpt/")}
    assert listed == {f"ckpt/{name}": len(data) for name, data in files.items()}

    received = download_dir(s3_store, "ckpt", tmp_path / "dst")
    assert sorted(received) == sorted(files)
    for name in files:
        assert digest(tmp_path / "dst" / name) == digest(source / name)

    s3_store.delete([f"ckpt/{name}" for name in files])
    assert s3_store.list("ckpt/") == []


def test_an_empty_upload_leaves_its_connection_fit_for_the_next_request(
    s3_server: LocalS3Server, s3_uri: str, tmp_path: Path
) -> None:
    """boto/botocore#3755: botocore asks for ``100 Continue`` before every file body, an empty one too.

    A Go server (SeaweedFS, MinIO) answers an empty body with its final 200 at once, and botocore
    1.36 then parses the next response on that pooled connection against the stale status: a
    silent stall of the whole read timeout, then a hidden retry that sends the request again.
    Empty files are ordinary in checkpoints (an empty added_tokens.json), so every request after
    one paid it. A short read timeout keeps the failure quick on the affected versions.
    """
    config = replace(s3_server.config, read_timeout_s=3.0, max_concurrency=1)
    client = make_s3_client(config)
    sent: list[str] = []
    client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.method))
    store = S3ObjectStore(parse_uri(s3_uri), config, RetryPolicy(deadline_s=30), client=client)
    files = write_files(tmp_path, {"empty": b"", "data": b"x" * 1000})

    store.upload_files([(files / "empty", "empty")])
    store.upload_files([(files / "data", "data")])
    assert store.get_bytes("data") == b"x" * 1000
    assert store.get_bytes("empty") == b""
    assert sent == ["PUT", "PUT", "GET", "GET"], "a request was sent twice: botocore retried a poisoned connection"


@pytest.mark.version_neutral
def test_a_stopped_server_keeps_what_it_acknowledged(tmp_path: Path) -> None:
    """stop() gives SeaweedFS 2 s before SIGKILL: every acknowledged write must be there after a restart."""
    files = {"model.safetensors": os.urandom(2 * 1024 * 1024 + 5), "trainer_state.json": b"{}", "empty": b""}
    source = write_files(tmp_path / "src", files)
    server = LocalS3Server(tmp_path / "s3")
    with server:
        server.create_bucket(TEST_BUCKET)
        store = S3ObjectStore(parse_uri(f"s3://{TEST_BUCKET}/kept"), server.config)
        upload_dir(store, source, "ckpt")
        store.put_bytes("record.json", b'{"step": 7}')
    with server:  # the same directory and port, started again
        store = S3ObjectStore(parse_uri(f"s3://{TEST_BUCKET}/kept"), server.config)
        download_dir(store, "ckpt", tmp_path / "dst")
        assert store.get_bytes("record.json") == b'{"step": 7}'
    for name in files:
        assert digest(tmp_path / "dst" / name) == digest(source / name)


def test_bytes_and_prefix_isolation(s3_server: LocalS3Server, s3_store: S3ObjectStore) -> None:
    s3_store.put_bytes("a/b.json", b"{}")
    assert s3_store.get_bytes("a/b.json") == b"{}"
    sibling = S3ObjectStore(parse_uri(f"{s3_store.uri}-sibling"), s3_server.config)
    assert sibling.list() == []


def test_wrong_credentials_are_named(s3_server: LocalS3Server, s3_uri: str) -> None:
    for key_id, shown in ((s3_server.access_key, "..."), ("AKIAIOSFODNN7EXAMPLE", "...MPLE")):
        config = replace(s3_server.config, access_key_id=key_id, secret_access_key="not-the-secret")
        with pytest.raises(StoreCredentialsError) as caught:
            S3ObjectStore(parse_uri(s3_uri), config).check()
        assert "refused the credentials" in str(caught.value)
        assert f"access key '{shown}'" in str(caught.value), "only the last four characters of a long key id"
        assert f"'{key_id}'" not in str(caught.value)


def test_missing_bucket_is_named_and_can_be_created(s3_server: LocalS3Server) -> None:
    store = S3ObjectStore(parse_uri("s3://spotray-missing-bucket/run"), s3_server.config)
    with pytest.raises(BucketMissingError) as caught:
        store.check()
    assert "bucket 'spotray-missing-bucket' does not exist" in str(caught.value)
    assert "s3 mb s3://spotray-missing-bucket" in str(caught.value)
    with pytest.raises(BucketMissingError):
        store.put_bytes("x", b"x")  # writes do not create buckets behind the user's back
    store.check(create_bucket=True)
    store.put_bytes("x", b"x")
    assert [o.key for o in store.list()] == ["x"]


def test_the_server_takes_writes_to_many_buckets_whatever_the_free_disk(s3_server: LocalS3Server) -> None:
    """Each bucket takes 7 volume slots at its first write; with slots counted from free disk (the
    default) a machine with 15 GB free had 14, and a third bucket's writes failed (InternalError)."""
    for index in range(4):
        store = S3ObjectStore(parse_uri(f"s3://spotray-many-{index}/run"), s3_server.config)
        store.check(create_bucket=True)
        store.put_bytes("x", str(index).encode())
        assert store.get_bytes("x") == str(index).encode()


def test_unreachable_endpoint_fails_fast_with_the_fix() -> None:
    config = StoreConfig(endpoint_url=f"http://127.0.0.1:{free_port()}", access_key_id="a", secret_access_key="b")
    store = S3ObjectStore(parse_uri(f"s3://{TEST_BUCKET}/x"), config, RetryPolicy(deadline_s=1.0))
    with pytest.raises(StoreUnreachableError) as caught:
        store.check()
    assert config.endpoint_url is not None
    assert config.endpoint_url in str(caught.value)
    assert "AWS_ENDPOINT_URL" in str(caught.value)


def test_a_hung_endpoint_fails_the_preflight_check_within_seconds() -> None:
    """A server that accepts connections and never answers (hung, or paused as in
    tests/integration/test_store_outage.py) fails the check by the preflight's own read timeout,
    as an unreachable one does: a job facing it exits as an infrastructure fault in seconds, not
    after botocore's 4 tries of a store's 60 s read timeout (measured: 241 s)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # the kernel completes each connection; nothing ever reads a request
        config = StoreConfig(
            endpoint_url=f"http://127.0.0.1:{listener.getsockname()[1]}", access_key_id="a", secret_access_key="b"
        )
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError) as caught:
            S3ObjectStore(parse_uri(f"s3://{TEST_BUCKET}/x"), config).check()
        took = time.monotonic() - started
    assert "Read timeout" in str(caught.value)
    assert took < 45, f"the check gave up after {took:.0f} s"


def test_file_bodies_go_unsigned_and_a_checking_server_takes_them(
    s3_server: LocalS3Server, s3_uri: str, tmp_path: Path
) -> None:
    """No SigV4 payload hash: it cost two more SHA-256 passes per checkpoint (client and server).

    The server still checks each request's signature (SeaweedFS does with credentials set); the
    bytes are checked end to end against the manifest's SHA-256 when fetched.
    """
    client = make_s3_client(s3_server.config)
    content_hashes: list[str] = []
    client.meta.events.register(
        "before-send.s3",
        lambda request, **_: content_hashes.append(str(request.headers.get("x-amz-content-sha256", b""), "ascii")),
    )
    store = S3ObjectStore(parse_uri(s3_uri), s3_server.config, client=client)
    files = write_files(tmp_path, {"model.safetensors": os.urandom(20 * 1024 * 1024 + 7), "small": b"x"})
    upload_dir(store, files, "unsigned")
    assert content_hashes, "no request was seen"
    assert set(content_hashes) == {"UNSIGNED-PAYLOAD"}
    received = download_dir(store, "unsigned", tmp_path / "back")
    assert sorted(received) == ["model.safetensors", "small"]
    assert digest(tmp_path / "back" / "model.safetensors") == digest(files / "model.safetensors")
