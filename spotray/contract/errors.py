"""Errors that name the problem and the fix.

Every error a user can cause (a bad URI, wrong credentials, a missing bucket, a corrupt checkpoint)
is one of these, so callers can print ``str(error)`` and nothing else: the message is the whole
explanation, ending with what to do about it.
"""

from __future__ import annotations


class SpotrayError(Exception):
    """Base class: ``problem`` says what went wrong, ``fix`` what to do about it."""

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
    """The object store endpoint did not answer, even after retries."""


class StoreCredentialsError(SpotrayError):
    """The object store refused the credentials."""


class BucketMissingError(SpotrayError):
    """The bucket named in a URI does not exist."""


class StoreRequestError(SpotrayError):
    """The object store refused a request for a reason that retrying will not change."""


class CorruptCheckpointError(SpotrayError):
    """A checkpoint's files do not match its manifest."""


class ObjectTooLargeError(SpotrayError):
    """A manifest or record is larger than any spotray writes: read no further, it was not ours."""

    @classmethod
    def for_object(cls, where: str, max_bytes: int) -> ObjectTooLargeError:
        return cls(
            f"{where} is more than the {max_bytes} bytes such an object can be, so it was not read",
            "spotray never writes one this large: check who can write to the bucket, and delete the object",
        )


class CheckpointUploadError(SpotrayError):
    """A checkpoint could not be uploaded; training must not go on as if it were safe."""


class CheckpointAbandonedError(SpotrayError):
    """A checkpoint several nodes save was given up (one node dropped its part): a warning, not a failure."""
