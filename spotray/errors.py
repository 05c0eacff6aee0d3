"""Exit codes the ``spotray`` command promises, and which error gives which.

Scripts may rely on them: 0 ok, 1 the thing asked for failed (a run failed, a checkpoint is
incomplete or corrupt, S3 or the cluster refused), 2 bad input (a manifest, a URI or a flag is
wrong), 3 not found (no such run, checkpoint or bucket).
"""

from __future__ import annotations

from spotray.contract.errors import (
    BucketMissingError,
    CheckpointUploadError,
    CorruptCheckpointError,
    SpotrayError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_INTERRUPTED = 130


class NotFoundError(SpotrayError):
    """The run, checkpoint, attempt or object named does not exist."""


class CommandFailedError(SpotrayError):
    """What the command set out to do could not be done (not the user's input at fault)."""


_FAILURES = (
    CommandFailedError,
    CorruptCheckpointError,
    CheckpointUploadError,
    StoreUnreachableError,
    StoreCredentialsError,
    StoreRequestError,
)


def exit_code_for(error: SpotrayError) -> int:
    """Not found is 3, a failure 1; any other SpotrayError is about the input, so 2."""
    if isinstance(error, NotFoundError | BucketMissingError):
        return EXIT_NOT_FOUND
    if isinstance(error, _FAILURES):
        return EXIT_FAILED
    return EXIT_BAD_INPUT
