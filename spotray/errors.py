"""Exit codes the ``spotray`` command promises, and which error gives which.

Scripts may rely on them: 0 ok, 1 the thing asked for failed (a run failed, a checkpoint is
incomplete or corrupt, S3 or the cluster refused), 2 bad input (a manifest, a URI or a flag is
wrong), 3 not found (no such run, checkpoint or bucket), 130 interrupted (Ctrl-C). The codes are
declared once, with the job driver's, in spotray/contract/attempts.py.
"""

from __future__ import annotations

from spotray.contract.attempts import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_FOUND
from spotray.contract.errors import (
    BucketMissingError,
    CheckpointUploadError,
    CorruptCheckpointError,
    SpotrayError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
)


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
