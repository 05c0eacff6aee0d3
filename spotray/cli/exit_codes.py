"""Exit codes the ``spotray`` command promises, and which error gives which.

Scripts may rely on them: 0 ok, 1 the thing asked for failed (a run failed, a checkpoint is
incomplete or corrupt, S3 or the cluster refused or did not answer), 2 bad input (a manifest, a URI or a flag is
wrong), 3 not found (no such run, checkpoint or bucket), 130 interrupted (Ctrl-C). The codes are
declared once, with the job driver's, in spotray/contract/attempts.py.
"""

from __future__ import annotations

from spotray.contract.attempts import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_FOUND
from spotray.contract.errors import (
    BucketMissingError,
    Cause,
    CorruptCheckpointError,
    SpotrayError,
    StoreCredentialsError,
    StoreRequestError,
    cause_of,
)


class NotFoundError(SpotrayError):
    """The run, checkpoint, attempt or object named does not exist."""


class CommandFailedError(SpotrayError):
    """What the command set out to do could not be done (not the user's input at fault)."""


# What the command set out to do was refused or found broken: 1, though the job counts some of them
# as bad input (spotray/contract/errors.py), since the codes scripts rely on say "S3 refused" is 1.
_FAILURES = (
    CommandFailedError,
    CorruptCheckpointError,
    StoreCredentialsError,
    StoreRequestError,
)


def exit_code_for(error: SpotrayError) -> int:
    """Not found is 3; a failure 1, an infrastructure fault included (the one classification,
    ``cause_of``: an unreachable store, a failed upload); any other SpotrayError is about the input, so 2."""
    if isinstance(error, NotFoundError | BucketMissingError):
        return EXIT_NOT_FOUND
    if isinstance(error, _FAILURES) or cause_of(error) is not Cause.BAD_INPUT:
        return EXIT_FAILED
    return EXIT_BAD_INPUT
