"""Which faults met fetching one checkpoint are that checkpoint's own (resume tries an older one) and
which are not (the attempt ends with the error): ``checkpoint_fault`` in train/checkpoints/resume.py."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError

from spotray.contract.errors import (
    BucketMissingError,
    CorruptCheckpointError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
)
from spotray.train.checkpoints.resume import checkpoint_fault
from spotray.train.storage.hashed_download import ShortReadError

pytestmark = [pytest.mark.unit, pytest.mark.core]


def refused(inner: BaseException) -> StoreRequestError:
    """What the S3 store raises when ``inner`` ended a download for good (``raise ... from``)."""
    try:
        raise StoreRequestError(f"the server refused to download: {inner}", "f") from inner
    except StoreRequestError as error:
        return error


NO_SUCH_KEY = ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObject")


@pytest.mark.parametrize(
    "error",
    [
        CorruptCheckpointError("checkpoint-20: file w.bin does not match its SHA-256 in the manifest", "f"),
        refused(NO_SUCH_KEY),  # an object the manifest lists, gone while the manifest stays
        refused(FileExistsError(errno.EEXIST, "File exists", "x/y")),  # keys x/y and x/y/z
        refused(NotADirectoryError(errno.ENOTDIR, "Not a directory", "x/y/z")),
        refused(IsADirectoryError(errno.EISDIR, "Is a directory", "x/y")),
        refused(OSError(errno.ENAMETOOLONG, "File name too long", "x" * 300)),  # S3 keys go to 1024 bytes
        FileNotFoundError(errno.ENOENT, "No such file or directory", "checkpoint-20/w.bin"),  # a directory store
    ],
    ids=lambda error: f"{type(error).__name__}({type(error.__cause__).__name__})",
)
def test_a_fault_of_the_checkpoint_itself_is_skipped_with_its_reason(error: BaseException) -> None:
    reason = checkpoint_fault(error)
    assert reason


@pytest.mark.parametrize(
    "error",
    [
        StoreUnreachableError("could not reach the server", "f"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        TimeoutError("timed out"),
        ShortReadError("got 10 of 20 bytes"),
        StoreCredentialsError("refused the credentials", "f"),  # every checkpoint would fail alike
        BucketMissingError("no bucket", "f"),
        refused(OSError(errno.ENOSPC, "No space left on device")),  # the node's disk, not the checkpoint
        OSError(errno.EROFS, "Read-only file system"),
        PermissionError(errno.EACCES, "Permission denied"),
        refused(ConnectionResetError(errno.ECONNRESET, "reset")),
        RuntimeError("a bug"),
    ],
    ids=lambda error: f"{type(error).__name__}({type(error.__cause__).__name__})",
)
def test_a_fault_of_the_store_the_node_or_the_code_is_not_skipped(error: BaseException) -> None:
    """Skipping would resume from an older step, or afresh, for a fault no checkpoint can cure."""
    assert checkpoint_fault(error) is None


def test_the_reason_names_what_could_not_be_written() -> None:
    reason = checkpoint_fault(refused(FileExistsError(errno.EEXIST, "File exists", "/node/.checkpoint-20.partial/x/y")))
    assert reason is not None
    assert "cannot be files" in reason
    assert "x/y" in reason
