"""Errors that name the problem and the fix.

Every error a user can cause (a bad URI, wrong credentials, a missing bucket, a corrupt checkpoint)
is one of these, so callers can print ``str(error)`` and nothing else: the message is the whole
explanation, ending with what to do about it.

Each error also says whose it is to fix, its ``Cause``: declared on its class (``SupersededError``,
train/records/attempt_records.py, decides per instance) and read through ``cause_of``, the one
classification shared by the job's driver (its exit code, spotray/contract/attempts.py
``attempt_exit_code``, which the controller and local mode read), the crash-loop guard and the
``spotray`` command (spotray/cli/exit_codes.py):

- BAD_INPUT, the user must change something: a URI or bucket name, credentials a server refused (or
  none at all), a missing bucket the run may not create, a spec refused for its content, a corrupt
  or foreign object in the store, another run writing to the same checkpoint URI. The run fails at
  once, with the message; a retry would be refused the same way.
- INFRASTRUCTURE, nobody's input and not the training code: the store did not answer or kept
  failing (5xx, throttling), a checkpoint upload failed, a newer attempt of the run took over, a
  connection failed or timed out, Ray's own faults (train/launch/launcher.py ``fit_failure_cause``).
  No budget is spent: the attempt is tried again after a backoff.
- TRAINING, any other exception: the training code's own failure, which spends
  ``spec.retry.maxFailures``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import StrEnum


class Cause(StrEnum):
    """Whose an error is to fix, and so what it costs the run (see the module docstring)."""

    BAD_INPUT = "bad input"
    INFRASTRUCTURE = "infrastructure"
    TRAINING = "training"


class SpotrayError(Exception):
    """Base class: ``problem`` says what went wrong, ``fix`` what to do about it.

    ``cause``: a plain ``SpotrayError`` (a flag, a setting) is bad input; a subclass may say otherwise.
    """

    cause: Cause = Cause.BAD_INPUT

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  fix: {fix}")

    def __reduce__(self) -> tuple[type[SpotrayError], tuple[str, str]]:
        # Rebuilt from both parts when it crosses a process boundary (the upload process).
        return (type(self), (self.problem, self.fix))


class InvalidUriError(SpotrayError):
    """A storage URI that does not parse."""


class StoreUnreachableError(SpotrayError):
    """The object store endpoint did not answer, or kept failing (5xx, throttling), even after retries."""

    cause = Cause.INFRASTRUCTURE


class NodeClockSkewError(SpotrayError):
    """The object store refused a request signed too far from its own clock (RequestTimeTooSkewed): the
    clock of the node that sent it, which another node or a clock set right again cures."""

    cause = Cause.INFRASTRUCTURE


class StoreCredentialsError(SpotrayError):
    """The object store refused the credentials."""


class BucketMissingError(SpotrayError):
    """The bucket named in a URI does not exist."""


class StoreRequestError(SpotrayError):
    """The object store refused a request for a reason that retrying will not change."""


class CorruptCheckpointError(SpotrayError):
    """A checkpoint's files do not match its manifest."""


class ForeignCheckpointError(CorruptCheckpointError):
    """A checkpoint whose manifest is not signed with the reader's key: a run with another key (or none)
    wrote it, or someone forged it. Never loaded, pruned or written over; a job that finds one newer
    than any it can verify refuses to start (train/checkpoints/resume.py ``refuse_foreign_newer``)."""


class UnloadableCheckpointError(SpotrayError):
    """A complete checkpoint whose files verify, but that the job cannot load.

    Not the model the job builds (another shape, other weights), or files its loader refuses
    (a truncated weights file, pickled objects a safe load will not run). Resume skips such a
    checkpoint for an older one; when no complete checkpoint loads, the run's checkpoint URI holds
    another job's checkpoints: bad input, since starting afresh there would mix two runs' steps.
    """


class ObjectTooLargeError(SpotrayError):
    """A manifest or record is larger than any spotray writes: read no further, it was not ours."""

    @classmethod
    def for_object(cls, where: str, max_bytes: int) -> ObjectTooLargeError:
        return cls(
            f"{where} is more than the {max_bytes} bytes such an object can be, so it was not read",
            "spotray never writes one this large: check who can write to the bucket, and delete the object",
        )


class CheckpointUploadError(SpotrayError):
    """A checkpoint could not be uploaded; training must not go on as if it were safe.

    Infrastructure (the store, the node's disk, the upload process), unless it was raised from an
    error whose cause says otherwise (refused credentials: bad input), which ``cause_of`` reads.
    """

    cause = Cause.INFRASTRUCTURE


class CheckpointAbandonedError(SpotrayError):
    """A checkpoint several nodes save was given up (one node dropped its part): a warning, not a failure."""

    cause = Cause.INFRASTRUCTURE


# How deep ``cause_of`` follows ``raise ... from``: a chain is a few links long; a longer one was not made by us.
_MAX_CHAIN = 16


def cause_of(error: BaseException) -> Cause:
    """Whose ``error`` is to fix: the one classification (see the module docstring).

    A ``SpotrayError`` raised ``from`` another (an upload that failed on refused credentials, local
    mode's "records cannot be read" over an unreachable store) takes the cause of the innermost
    ``SpotrayError`` in its chain: the root of the trouble says whose it is. A connection that
    failed or a timeout (``ConnectionError``, ``TimeoutError``) is infrastructure; any other
    exception is the training code's own.
    """
    if isinstance(error, SpotrayError):
        root: SpotrayError = error
        inner = error.__cause__
        for _ in range(_MAX_CHAIN):
            if inner is None:
                break
            if isinstance(inner, SpotrayError):
                root = inner
            inner = inner.__cause__
        return root.cause
    if isinstance(error, ConnectionError | TimeoutError):
        return Cause.INFRASTRUCTURE
    return Cause.TRAINING


def unknown_field(path: str, key: object, known: Iterable[str]) -> str:
    """The problem an unknown key makes, with the closest known name when one is near (a typo)."""
    names = sorted(known)
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{path}: unknown field{hint} (known: {', '.join(names)})"
