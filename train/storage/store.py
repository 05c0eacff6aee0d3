"""Object stores: S3-compatible servers (AWS, MinIO, SeaweedFS) and plain directories (NFS).

A store is rooted at a URI (``s3://bucket/runs/gpt2`` or ``file:///mnt/nfs/runs/gpt2``) and every key
is relative to that root, so the checkpoint code never sees a bucket name. ``open_store`` is the one
factory; ``StoreConfig.from_env`` is the one place that reads endpoint and credentials.

Transfers of whole directories go through one s3transfer ``TransferManager`` so that files and the
parts of large files move concurrently. Transient faults (connection refused, timeouts, 5xx,
throttling) are retried with exponential backoff until a deadline; anything else fails at once with
an error that names the fix.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import boto3
from botocore import UNSIGNED
from botocore.awsrequest import AWSPreparedRequest
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from s3transfer.exceptions import RetriesExceededError, S3UploadFailedError
from s3transfer.manager import TransferConfig, TransferManager
from urllib3.exceptions import ProtocolError

from spotray.contract.attempts import MAX_RECORD_BYTES
from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import (
    BucketMissingError,
    NodeClockSkewError,
    ObjectTooLargeError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
)
from spotray.contract.uris import StorageUri, parse_uri
from spotray.train.storage.hashed_download import (
    FileToFetch,
    RangeToFetch,
    copy_hashed,
    download_hashed,
    download_ranges,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P")  # what a transfer moves: a local path (up), or a key of another store (a copy)
KeyFromEnv = Literal["from the environment"]

# ------------------------------------------------------------------------------------------- config


def _first_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


@dataclass(frozen=True)
class StoreConfig:
    """Where the S3 server is and how to talk to it. ``from_env`` reads the usual AWS variables.

    ``S3_ENDPOINT_URL`` is accepted too because MosaicML streaming reads that name, so one set of
    variables serves both the checkpoint code and the data loader.
    """

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    # Never in a repr, so never in a log line or traceback that prints the config.
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    # Unsigned requests, with no credentials from anywhere (not even boto3's chain of environment,
    # files, instance profile): how the controller reads for a run that names no Secret.
    anonymous: bool = False
    max_concurrency: int = 16
    multipart_chunk_bytes: int = 16 * 1024 * 1024
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    # Tries botocore makes of each request, inside each of our own (RetryPolicy) tries. Where a
    # deadline must hold against a server that accepts and never answers (the controller, the CLI),
    # 1: our deadline is then checked after each read timeout, not after four of them.
    request_attempts: int = 4

    @classmethod
    def from_env(cls) -> StoreConfig:
        return cls(
            endpoint_url=_first_env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT_URL"),
            region=_first_env("AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=_first_env("AWS_ACCESS_KEY_ID"),
            secret_access_key=_first_env("AWS_SECRET_ACCESS_KEY"),
            session_token=_first_env("AWS_SESSION_TOKEN"),
            max_concurrency=int(_first_env("SPOTRAY_S3_MAX_CONCURRENCY") or 16),
        )

    def describe_endpoint(self) -> str:
        return self.endpoint_url or f"AWS S3 ({self.region})"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter on transient faults, until ``deadline_s`` has passed."""

    deadline_s: float = 600.0
    first_delay_s: float = 0.5
    max_delay_s: float = 10.0

    def delays(self) -> Iterable[float]:
        delay = self.first_delay_s
        while True:
            yield delay * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography
            delay = min(delay * 2, self.max_delay_s)


# Long enough to ride out an S3 restart during a background upload, short enough to fail a
# misconfigured run within seconds when the user asks for a preflight check.
DEFAULT_RETRY = RetryPolicy()
# Downloads go in ranges of this size, up to max_concurrency at a time; each range is hashed from the
# file once it lands, so memory is a chunk per thread, not a range. 8 MiB ranges measured 5-15% slower
# on a 270 MB checkpoint-shaped set.
DOWNLOAD_PART_BYTES = 16 * 1024 * 1024
# Each range is read and written in chunks of this size; 4 MiB chunks cost twice the CPU (270 MB).
DOWNLOAD_READ_BYTES = 1024 * 1024
PREFLIGHT_RETRY = RetryPolicy(deadline_s=10.0)
# How long each request of the preflight check's HEAD waits for an answer (a store's own reads wait
# 60 s, for large objects). A store that accepts connections and never answers (a hung or paused
# server) then fails the check in about 20 s (botocore's 4 tries of 5 s each), as one that refuses them
# fails it in 10, not after 4 minutes: the attempt ends as an infrastructure fault and is tried again
# after the backoff.
PREFLIGHT_READ_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------- fault handling

_TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ServiceUnavailable",
        "InternalError",
        "500",
        "502",
        "503",
        "504",
    }
)
_CREDENTIAL_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "403"}
)
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})
# S3 refuses a request whose signature's time is more than 15 minutes off its own (AWS answers 403).
_CLOCK_SKEW_CODES = frozenset({"RequestTimeTooSkewed"})


def _client_error_code(error: ClientError) -> tuple[str, int]:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def transient_fault_summary(error: BaseException) -> str:
    """A transient fault in a few words, as the store gave it: "503 SlowDown", "500 InternalError",
    or the connection fault's own message; for a warning that names the cause (issue 72)."""
    if isinstance(error, ClientError):
        code, status = _client_error_code(error)
        if code and code != str(status):
            return f"{status} {code}" if status else code
        message = str(error.response.get("Error", {}).get("Message", "")) or "(no message)"
        return f"{status} {message}"  # a body botocore could not read: the status line's words
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def is_transient(error: BaseException) -> bool:
    """True for faults that may go away by themselves: network trouble, 5xx, throttling."""
    if isinstance(
        error,
        (
            EndpointConnectionError,
            ConnectionClosedError,
            ConnectTimeoutError,
            ReadTimeoutError,
            ProtocolError,
            ConnectionError,
            TimeoutError,
            RetriesExceededError,
        ),
    ):
        return True
    if isinstance(error, S3UploadFailedError):
        # s3transfer flattens the cause into the message; a 5xx or connection fault inside it is
        # still transient, an auth or missing-bucket refusal is not.
        text = str(error)
        return not any(code in text for code in (*_CREDENTIAL_CODES, *_MISSING_BUCKET_CODES, *_CLOCK_SKEW_CODES))
    if isinstance(error, ClientError):
        code, status = _client_error_code(error)
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    return False


# What of a server's error text reaches a message: it ends up in TrainingRun status and Events, and
# the server (or whoever answers at its address) chooses it.
_MAX_ERROR_TEXT = 300


def raise_first_permanent(errors: Sequence[BaseException]) -> None:
    """Raise the first error that retrying cannot cure, else the first one (a transient fault)."""
    permanent = [error for error in errors if not is_transient(error)]
    raise permanent[0] if permanent else errors[0]


def masked_key_id(key_id: str | None) -> str:
    """An access key id as consoles show it, by its last four characters only (none of a short one)."""
    if not key_id:
        return "<none>"
    return f"...{key_id[-4:]}" if len(key_id) >= 12 else "..."


def describe_failure(error: BaseException, config: StoreConfig, uri: StorageUri, action: str) -> Exception:
    """Turn a boto/s3transfer exception into a ``SpotrayError`` that says what to fix.

    The server's error text is cut to a bounded length, and the access key id shows only its last
    four characters: these messages reach logs, TrainingRun status and Events.
    """
    endpoint = config.describe_endpoint()
    if isinstance(error, NoCredentialsError):
        return StoreCredentialsError(
            f"no S3 credentials were found while trying to {action}",
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (on the cluster: the secret named in "
            "spec.checkpoint.secretRef)",
        )
    text = str(error)
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:_MAX_ERROR_TEXT] + " [cut]"
    code = _client_error_code(error)[0] if isinstance(error, ClientError) else ""
    if code in _MISSING_BUCKET_CODES or "NoSuchBucket" in text or (code == "404" and action.startswith("check")):
        return BucketMissingError(
            f"bucket '{uri.bucket}' does not exist at {endpoint}",
            f"create it (aws --endpoint-url {config.endpoint_url or '<endpoint>'} s3 mb s3://{uri.bucket}, "
            "or `mc mb` for MinIO), or let spotray create it with create_bucket=True / --create-bucket",
        )
    if code in _CLOCK_SKEW_CODES or "RequestTimeTooSkewed" in text:
        return NodeClockSkewError(
            f"{endpoint} refused to {action}: this node's clock is too far from the server's ({code or text})",
            "set the node's clock right (NTP); the next attempt, on a node with a good clock, goes on",
        )
    if code in _CREDENTIAL_CODES or any(c in text for c in _CREDENTIAL_CODES if not c.isdigit()):
        key = masked_key_id(config.access_key_id)
        return StoreCredentialsError(
            f"{endpoint} refused the credentials (access key '{key}') while trying to {action}: {code or text}",
            "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (on the cluster: the secret named in "
            f"spec.checkpoint.secretRef) and that the key may read and write s3://{uri.bucket}",
        )
    if is_transient(error):
        return StoreUnreachableError(
            f"could not reach {endpoint} to {action}: {text}",
            "check that the S3 server is running and that AWS_ENDPOINT_URL (or S3_ENDPOINT_URL) points at it",
        )
    return StoreRequestError(
        f"{endpoint} refused to {action}: {text}",
        "check the URI and the bucket's policy; this is not a transient fault, so retrying will not help",
    )


# ----------------------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class ObjectInfo:
    """One object under a store's root: ``key`` is relative to the root."""

    key: str
    size: int
    # Changes whenever the content may have (S3: the ETag; a directory: mtime and size): what a
    # reader compares to skip reading an object again.
    etag: str = ""


class ObjectStore(Protocol):
    """What the checkpoint code needs from storage. Keys are relative to ``uri``.

    ``checkpoint_key`` travels with the store, not with each call, so that every job (the user's own
    script too) signs and checks checkpoints once its environment holds the run's key: the store
    code never uses it, the checkpoint code (train/checkpoints/checkpoint.py) always does.
    """

    uri: StorageUri
    checkpoint_key: CheckpointKey | None

    def check(self, *, create_bucket: bool = False) -> None: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object; past ``max_bytes`` it raises ``ObjectTooLargeError`` without reading on."""
        ...

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None: ...
    def download_files(self, pairs: Sequence[tuple[str, Path]]) -> dict[Path, str]:
        """Fetch each key to its path; return the SHA-256 of each file, computed as its bytes arrived."""
        ...

    def download_ranges(self, ranges: Sequence[RangeToFetch]) -> None:
        """Fetch each range of an object into the same bytes of its local file (which exists); nothing is
        hashed (a checkpoint read by several nodes, train/checkpoints/shared_read.py, verifies whole files)."""
        ...

    def delete(self, keys: Sequence[str]) -> None: ...


def under(store: ObjectStore, prefix: str) -> ObjectStore:
    """The same store (bucket, credentials, key, client) seen from ``prefix`` below its root."""
    if isinstance(store, S3ObjectStore):
        return replace(store, uri=store.uri.join(prefix), client=store._client)
    if isinstance(store, LocalObjectStore):
        return replace(store, uri=store.uri.join(prefix))
    raise TypeError(f"no view under a prefix of a {type(store).__name__}")


def object_exists(store: ObjectStore, key: str) -> bool:
    """Whether ``key`` exists, by a LIST: stores differ in how a missing key fails a read."""
    return any(info.key == key for info in store.list(key))


def get_bytes_if_exists(store: ObjectStore, key: str, *, max_bytes: int = MAX_RECORD_BYTES) -> bytes | None:
    """The object's bytes, or None when there is no such object (a marker that is simply not there is
    not an error). Bounded by ``max_bytes``."""
    if not object_exists(store, key):
        return None
    return store.get_bytes(key, max_bytes=max_bytes)


def _read_bounded(read: Callable[[int], bytes], where: str, max_bytes: int | None) -> bytes:
    """Read a stream whole, or at most ``max_bytes`` of it: one byte more than that is an error."""
    if max_bytes is None:
        return read(-1)
    data = read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ObjectTooLargeError.for_object(where, max_bytes)
    return data


def _dir_base(prefix: str) -> str:
    """``prefix/``, or nothing for the store's root: MinIO refuses a key with an empty segment ("a//b")."""
    return prefix.rstrip("/") + "/" if prefix.strip("/") else ""


def upload_dir(store: ObjectStore, local_dir: Path, prefix: str, *, exclude: Iterable[str] = ()) -> list[str]:
    """Upload every file under ``local_dir`` to ``prefix/`` ("": the store root); returns the paths sent."""
    skip = set(exclude)
    rel_paths = sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob("*") if p.is_file())
    rel_paths = [r for r in rel_paths if r not in skip]
    base = _dir_base(prefix)
    store.upload_files([(local_dir / r, base + r) for r in rel_paths])
    return rel_paths


def download_dir(store: ObjectStore, prefix: str, local_dir: Path) -> list[str]:
    """Download every object under ``prefix/`` ("": the store root) into ``local_dir``; returns the paths."""
    base = _dir_base(prefix)
    rel_paths = [o.key[len(base) :] for o in store.list(base)]
    store.download_files([(base + r, local_dir / r) for r in rel_paths])
    return rel_paths


def make_s3_client(config: StoreConfig) -> S3Client:
    """A boto3 S3 client for ``config``: path-style addressing (MinIO), our timeouts, no extra checksums."""
    session = boto3.session.Session(
        aws_access_key_id=config.access_key_id,
        aws_secret_access_key=config.secret_access_key,
        aws_session_token=config.session_token,
        region_name=config.region,
    )
    botocore_config = Config(
        # Bodies go as UNSIGNED-PAYLOAD. SigV4 payload signing, which botocore does on plain HTTP and
        # on HTTPS without a per-request checksum, makes the client hash every byte once more to sign
        # it and the server once more to check it: two more SHA-256 passes over each checkpoint, on
        # the CPUs that train. It guards only the upload direction (responses are never signed), so
        # on plain HTTP it never made a store trustworthy; HTTPS covers the bytes in transit both
        # ways, and every checkpoint file is checked against its manifest's SHA-256 when fetched.
        s3={"addressing_style": "path", "payload_signing_enabled": False},
        # A few quick retries inside botocore (request_attempts); the long, deadline-bound retry is ours.
        retries={"mode": "standard", "total_max_attempts": config.request_attempts},
        max_pool_connections=config.max_concurrency + 4,
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s,
        # Integrity is checked end to end with the manifest's SHA-256; a CRC per request on
        # top of it only costs CPU that training needs.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        **({"signature_version": UNSIGNED} if config.anonymous else {}),
    )
    client = session.client("s3", endpoint_url=config.endpoint_url, config=botocore_config)
    client.meta.events.register("before-send.s3", _send_without_expect_header)
    return client


def _send_without_expect_header(request: AWSPreparedRequest, **_: object) -> None:
    """Send file bodies at once instead of asking for ``100 Continue`` first.

    botocore adds ``Expect: 100-continue`` to every file upload, an empty one too. A Go server
    (SeaweedFS, MinIO) answers an empty body with its final status at once, and botocore up to
    at least 1.36 then reads the next response on that pooled connection against the stale
    status: the whole read timeout lost, then the request sent again (boto/botocore#3755). All
    it would save is sending a part the server refuses, which happens only on errors. The
    header is not signed, so removing it after signing is safe.
    """
    if "Expect" in request.headers:
        del request.headers["Expect"]


@dataclass
class S3ObjectStore:
    """An S3 bucket (AWS, MinIO, SeaweedFS) seen from ``uri``; path-style addressing for MinIO."""

    uri: StorageUri
    config: StoreConfig = field(default_factory=StoreConfig.from_env)
    retry: RetryPolicy = DEFAULT_RETRY
    # A client made from this same config, to share: the controller reads many runs' stores with
    # one Secret's credentials, and making a client costs tens of milliseconds of CPU. None: make one.
    client: S3Client | None = field(default=None, repr=False, compare=False)
    checkpoint_key: CheckpointKey | None = field(default=None, kw_only=True)
    # Told of each transient fault it retries (the action, the fault in a few words): the upload
    # process reports them, so that the training process can say why uploads stall. Not pickled.
    on_transient_fault: Callable[[str, str], None] | None = field(default=None, repr=False, compare=False, kw_only=True)

    def __post_init__(self) -> None:
        self._client: S3Client = self.client or make_s3_client(self.config)
        self._transfer_config = TransferConfig(
            multipart_threshold=self.config.multipart_chunk_bytes,
            multipart_chunksize=self.config.multipart_chunk_bytes,
            max_request_concurrency=self.config.max_concurrency,
            io_chunksize=1024 * 1024,
        )

    def __getstate__(self) -> dict[str, object]:
        # A boto3 client cannot be pickled; the upload process builds its own from the config. Every
        # other field goes as it is: a list of them kept by hand once dropped the checkpoint key.
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "client": None, "on_transient_fault": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def _key(self, key: str) -> str:
        return f"{self.uri.prefix}/{key}" if self.uri.prefix else key

    def _with_retry(self, action: str, op: Callable[[], T], retry: RetryPolicy | None = None) -> T:
        policy = retry or self.retry
        deadline = time.monotonic() + policy.deadline_s
        for delay in policy.delays():
            try:
                return op()
            except (BotoCoreError, ClientError, S3UploadFailedError, OSError) as error:
                if not is_transient(error) or time.monotonic() + delay > deadline:
                    raise describe_failure(error, self.config, self.uri, action) from error
                log.warning("transient S3 fault while trying to %s (%s); retrying in %.1fs", action, error, delay)
                if self.on_transient_fault is not None:
                    self.on_transient_fault(action, transient_fault_summary(error))
                time.sleep(delay)
        raise AssertionError("unreachable: delays() never ends")

    def check(self, *, create_bucket: bool = False) -> None:
        """Fail fast, with the fix, on a wrong endpoint, wrong credentials or a missing bucket."""
        bucket = self.uri.bucket
        retry = PREFLIGHT_RETRY if self.retry.deadline_s > PREFLIGHT_RETRY.deadline_s else self.retry
        # The HEAD goes through a client of its own with a short read timeout, so that a hung server
        # fails the check in seconds (PREFLIGHT_READ_TIMEOUT_S); the store's client keeps its long one.
        head_client = self._client
        if self.config.read_timeout_s > PREFLIGHT_READ_TIMEOUT_S:
            head_client = make_s3_client(replace(self.config, read_timeout_s=PREFLIGHT_READ_TIMEOUT_S))
        try:
            self._with_retry(f"check bucket s3://{bucket}", lambda: head_client.head_bucket(Bucket=bucket), retry)
        except BucketMissingError:
            if not create_bucket:
                raise
            # The store's own client, with its long read timeout: the server has just answered the
            # HEAD, so it is not hung, and a CreateBucket cut short while the server goes on to create
            # the bucket would be sent again by botocore and refused (BucketAlreadyOwnedByYou).
            log.info("creating bucket s3://%s at %s", bucket, self.config.describe_endpoint())
            self._with_retry(f"create bucket s3://{bucket}", lambda: self._client.create_bucket(Bucket=bucket), retry)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        root = f"{self.uri.prefix}/" if self.uri.prefix else ""

        def op() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.uri.bucket, Prefix=root + prefix):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"][len(root) :], int(item["Size"]), item.get("ETag", "")))
            return found

        return self._with_retry(f"list {self.uri.join(prefix)}", op)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._with_retry(
            f"write {self.uri.join(key)}",
            lambda: self._client.put_object(Bucket=self.uri.bucket, Key=self._key(key), Body=data),
        )

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        def op() -> bytes:
            body = self._client.get_object(Bucket=self.uri.bucket, Key=self._key(key))["Body"]
            with closing(body):
                return _read_bounded(body.read, str(self.uri.join(key)), max_bytes)

        return self._with_retry(f"read {self.uri.join(key)}", op)

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        self._transfer(
            f"upload {len(pairs)} file(s) to {self.uri}",
            pairs,
            lambda tm, path, key: tm.upload(str(path), self.uri.bucket, self._key(key)),
        )

    def download_files(self, pairs: Sequence[tuple[str, Path]]) -> dict[Path, str]:
        """Ranges of every file in parallel, each hashed as it arrives (train/storage/hashed_download.py).

        One LIST of the keys' common prefix gives the sizes to split into ranges; a key it does not
        show is fetched in one request, which fails as a missing key does. Failed files are retried
        whole, as transfers are.
        """
        if not pairs:
            return {}
        # A character prefix on purpose: S3 lists by string prefix, not by path components.
        common = os.path.commonprefix([key for key, _ in pairs])  # noqa: RUF071
        listed = {o.key: o.size for o in self.list(common)}
        pending = [FileToFetch(key, path, listed.get(key)) for key, path in pairs]
        digests: dict[Path, str] = {}

        def attempt() -> None:
            nonlocal pending
            fetched, failures = download_hashed(
                pending,
                self._read_range,
                part_bytes=DOWNLOAD_PART_BYTES,
                concurrency=self.config.max_concurrency,
            )
            digests.update(fetched)
            pending = [target for target, _ in failures]
            if failures:
                raise_first_permanent([error for _, error in failures])

        self._with_retry(f"download {len(pairs)} file(s) from {self.uri}", attempt)
        return digests

    def download_ranges(self, ranges: Sequence[RangeToFetch]) -> None:
        pending = list(ranges)

        def attempt() -> None:
            nonlocal pending
            failures = download_ranges(
                pending, self._read_range, part_bytes=DOWNLOAD_PART_BYTES, concurrency=self.config.max_concurrency
            )
            pending = [target for target, _ in failures]
            if failures:
                raise_first_permanent([error for _, error in failures])

        self._with_retry(f"download {len(ranges)} range(s) from {self.uri}", attempt)

    def _read_range(self, key: str, offset: int, length: int | None) -> Iterator[bytes]:
        if length is None:
            response = self._client.get_object(Bucket=self.uri.bucket, Key=self._key(key))
        else:
            byte_range = f"bytes={offset}-{offset + length - 1}"
            response = self._client.get_object(Bucket=self.uri.bucket, Key=self._key(key), Range=byte_range)
        with closing(response["Body"]) as body:
            yield from body.iter_chunks(DOWNLOAD_READ_BYTES)

    def copy_in(self, source: S3ObjectStore, pairs: Sequence[tuple[str, str]]) -> None:
        """Copy each of ``source``'s keys to this store's key inside S3 (CopyObject; multipart for large
        objects): no byte passes through this machine. ``source`` must be readable with this store's
        credentials (``shares_credentials``)."""
        bucket = source.uri.bucket
        self._transfer(
            f"copy {len(pairs)} object(s) from {source.uri} to {self.uri}",
            pairs,
            lambda tm, key, to: tm.copy({"Bucket": bucket, "Key": source._key(key)}, self.uri.bucket, self._key(to)),
        )

    def shares_credentials(self, other: ObjectStore) -> bool:
        """Whether ``other`` is an S3 store of the same endpoint and credentials: one that ``copy_in`` can copy from."""
        if not isinstance(other, S3ObjectStore):
            return False
        mine, theirs = self.config, other.config
        return (mine.endpoint_url, mine.access_key_id, mine.anonymous) == (
            theirs.endpoint_url,
            theirs.access_key_id,
            theirs.anonymous,
        )

    def _transfer(
        self,
        action: str,
        pairs: Sequence[tuple[P, str]],
        submit: Callable[[TransferManager, P, str], object],
    ) -> None:
        """Run all transfers in one manager (files and parts in parallel); retry only the failed ones."""
        pending = list(pairs)

        def attempt() -> None:
            nonlocal pending
            failures: list[tuple[tuple[P, str], BaseException]] = []
            with TransferManager(self._client, self._transfer_config) as manager:
                futures = [(pair, submit(manager, *pair)) for pair in pending]
                for pair, future in futures:
                    try:
                        future.result()  # type: ignore[attr-defined]
                    except (BotoCoreError, ClientError, S3UploadFailedError, OSError) as error:
                        failures.append((pair, error))
            pending = [pair for pair, _ in failures]
            if failures:
                raise_first_permanent([error for _, error in failures])

        if pending:
            self._with_retry(action, attempt)

    def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch: list[ObjectIdentifierTypeDef] = [{"Key": self._key(k)} for k in keys[start : start + 1000]]

            def op(batch: list[ObjectIdentifierTypeDef] = batch) -> None:
                response = self._client.delete_objects(Bucket=self.uri.bucket, Delete={"Objects": batch, "Quiet": True})
                errors = response.get("Errors", [])
                if errors:
                    first = errors[0]
                    raise ClientError(
                        {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                        "DeleteObjects",
                    )

            self._with_retry(f"delete {len(batch)} object(s) under {self.uri}", op)


def _copy_file(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)


@dataclass
class LocalObjectStore:
    """A directory (for example an NFS mount shared by all Ray nodes) used as an object store.

    Writes go to a temporary name and are renamed into place, so a reader never sees half a file.
    """

    uri: StorageUri
    checkpoint_key: CheckpointKey | None = field(default=None, kw_only=True)

    @property
    def root(self) -> Path:
        return Path(self.uri.prefix)

    def check(self, *, create_bucket: bool = False) -> None:
        if create_bucket:
            self.root.mkdir(parents=True, exist_ok=True)
        if not self.root.is_dir():
            raise BucketMissingError(
                f"directory {self.root} does not exist",
                f"create it (mkdir -p {self.root}) or mount the shared volume there",
            )

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.rglob("*"):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not path.name.endswith(".spotray-tmp"):
                stat = path.stat()
                found.append(ObjectInfo(key, stat.st_size, f"{stat.st_mtime_ns}-{stat.st_size}"))
        return sorted(found, key=lambda o: o.key)

    def _write_atomically(self, key: str, write: Callable[[Path], object]) -> None:
        target = self.root / key
        temporary = target.with_name(target.name + ".spotray-tmp")
        for tries_left in reversed(range(3)):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                write(temporary)
                temporary.replace(target)
                return
            except FileNotFoundError:
                # Another process (a node sharing this directory) deleted the last object of this
                # "directory" and removed it between our mkdir and our write: make it again.
                if not tries_left:
                    raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomically(key, lambda tmp: tmp.write_bytes(data))

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        with (self.root / key).open("rb") as handle:
            return _read_bounded(handle.read, str(self.uri.join(key)), max_bytes)

    def upload_files(self, pairs: Sequence[tuple[Path, str]]) -> None:
        for path, key in pairs:
            self._write_atomically(key, partial(_copy_file, path))

    def download_files(self, pairs: Sequence[tuple[str, Path]]) -> dict[Path, str]:
        return {path: copy_hashed(self.root / key, path) for key, path in pairs}

    def download_ranges(self, ranges: Sequence[RangeToFetch]) -> None:
        for target in ranges:
            with (self.root / target.key).open("rb") as source, target.path.open("r+b") as local:
                source.seek(target.offset)
                local.seek(target.offset)
                left = target.length
                while left and (data := source.read(min(left, DOWNLOAD_PART_BYTES))):
                    local.write(data)
                    left -= len(data)
                if left:
                    raise FileNotFoundError(f"{self.root / target.key}: shorter than its range {target}")

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            path = self.root / key
            path.unlink(missing_ok=True)
            # Like S3, a "directory" exists only while something is in it. Deleting a key that is not
            # there is no error, as in S3, and neither is a directory another process just filled or removed.
            for parent in path.parents:
                if parent == self.root or not parent.is_relative_to(self.root):
                    break
                try:
                    parent.rmdir()
                except OSError:  # not empty, or already gone
                    break


def open_store(
    uri: str | StorageUri,
    config: StoreConfig | None = None,
    retry: RetryPolicy | None = None,
    checkpoint_key: CheckpointKey | KeyFromEnv | None = "from the environment",
) -> ObjectStore:
    """The one factory for stores: ``s3://`` gives an S3 store, ``file://`` or ``/path`` a directory.

    The store signs and checks checkpoints with ``checkpoint_key``: by default the run's key in this
    process's environment (``SPOTRAY_CHECKPOINT_KEY``), if any; None for a reader that has no key.
    """
    parsed = uri if isinstance(uri, StorageUri) else parse_uri(uri)
    key = CheckpointKey.from_env() if checkpoint_key == "from the environment" else checkpoint_key
    if parsed.scheme == "file":
        return LocalObjectStore(parsed, checkpoint_key=key)
    return S3ObjectStore(parsed, config or StoreConfig.from_env(), retry or DEFAULT_RETRY, checkpoint_key=key)
