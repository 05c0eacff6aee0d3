"""One classification of what ended an attempt, declared once (spotray/contract/errors.py ``cause_of``) and
read by the job's main, the launcher, the crash-loop guard and the CLI.

BAD INPUT: the user must change something (a URI, a bucket name, credentials a server refused, a
missing bucket the run may not create, a spec refused for its content): the run ends at once.
INFRASTRUCTURE: the store did not answer or failed, Ray's cluster failed, a newer attempt took over:
never spends a budget, the attempt is tried again after a backoff. Anything else the training code
raised is its own failure and spends ``spec.retry.maxFailures``.
"""

import pickle

import pytest

from spotray.cli.exit_codes import CommandFailedError, NotFoundError, exit_code_for
from spotray.contract.attempts import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INFRASTRUCTURE,
    AttemptId,
    Fence,
    attempt_exit_code,
)
from spotray.contract.errors import (
    BucketMissingError,
    Cause,
    CheckpointAbandonedError,
    CheckpointUploadError,
    CorruptCheckpointError,
    InvalidUriError,
    ObjectTooLargeError,
    SpotrayError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
    cause_of,
)
from spotray.contract.extras import MissingExtraError
from spotray.contract.spec import InvalidSpecError
from spotray.train.records.attempt_records import SupersededError

pytestmark = [pytest.mark.unit, pytest.mark.core]

ATTEMPT = AttemptId("uid-1", 1)


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised ``from inner``, as the uploader and local mode wrap what they caught."""
    try:
        try:
            raise inner
        except BaseException as caught:
            raise outer from caught
    except BaseException as error:
        return error


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        # The user must change something; a retry would be refused the same way.
        (InvalidUriError("p", "f"), Cause.BAD_INPUT),
        (InvalidSpecError(["spec.checkpoint.uri: bad"]), Cause.BAD_INPUT),
        (StoreCredentialsError("refused the credentials", "f"), Cause.BAD_INPUT),
        (BucketMissingError("bucket 'x' does not exist", "f"), Cause.BAD_INPUT),
        (StoreRequestError("refused to write: InvalidBucketName", "f"), Cause.BAD_INPUT),
        (ObjectTooLargeError("p", "f"), Cause.BAD_INPUT),
        (CorruptCheckpointError("p", "f"), Cause.BAD_INPUT),
        (MissingExtraError("p", "f"), Cause.BAD_INPUT),
        (SpotrayError("no checkpoint URI", "pass --checkpoint-uri"), Cause.BAD_INPUT),
        # Not the user's and not the code's: try again later, spend nothing.
        (StoreUnreachableError("could not reach http://127.0.0.1:9", "f"), Cause.INFRASTRUCTURE),
        (CheckpointUploadError("uploading checkpoint-20 failed", "f"), Cause.INFRASTRUCTURE),
        (CheckpointAbandonedError("p", "f"), Cause.INFRASTRUCTURE),
        (SupersededError(ATTEMPT, Fence("uid-1", 2)), Cause.INFRASTRUCTURE),  # this run's newer attempt
        (ConnectionResetError("peer reset"), Cause.INFRASTRUCTURE),
        (TimeoutError("timed out"), Cause.INFRASTRUCTURE),
        # The training code's own failures.
        (ValueError("bug"), Cause.TRAINING),
        (RuntimeError("CUDA out of memory"), Cause.TRAINING),
    ],
    ids=lambda value: value.__class__.__name__ if isinstance(value, BaseException) else str(value),
)
def test_every_error_has_one_cause(error: BaseException, cause: Cause) -> None:
    assert cause_of(error) is cause


def test_another_run_writing_to_the_same_checkpoint_uri_is_bad_input() -> None:
    """Two runs sharing a URI would take the fence from each other for ever: the user must give each its own."""
    other = SupersededError(ATTEMPT, Fence("uid-2", 1))
    assert cause_of(other) is Cause.BAD_INPUT
    assert "spec.checkpoint.uri" in other.fix
    assert cause_of(SupersededError(ATTEMPT, Fence("uid-1", 3))) is Cause.INFRASTRUCTURE


def test_superseded_errors_cross_a_process_boundary_with_their_cause() -> None:
    """The upload process sends its exception back pickled."""
    for fence in (Fence("uid-1", 2), Fence("uid-2", 1)):
        error = SupersededError(ATTEMPT, fence)
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is SupersededError
        assert (str(again), cause_of(again)) == (str(error), cause_of(error))


def test_a_wrapper_takes_the_cause_of_the_spotray_error_it_wraps() -> None:
    upload = CheckpointUploadError("uploading checkpoint-20 failed", "f")
    assert cause_of(chained(upload, StoreCredentialsError("refused", "f"))) is Cause.BAD_INPUT
    assert cause_of(chained(upload, StoreUnreachableError("down", "f"))) is Cause.INFRASTRUCTURE
    assert cause_of(chained(upload, OSError(28, "No space left on device"))) is Cause.INFRASTRUCTURE
    # Local mode wraps the store's error when an ended attempt's records cannot be read.
    wrapped = chained(SpotrayError("its records cannot be read", "f"), StoreUnreachableError("down", "f"))
    assert cause_of(wrapped) is Cause.INFRASTRUCTURE
    # The training code's own exception stays its own, whatever it caught on the way.
    assert cause_of(chained(ValueError("bug"), StoreUnreachableError("down", "f"))) is Cause.TRAINING


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (StoreUnreachableError("could not reach", "f"), 75),
        (CheckpointUploadError("p", "f"), 75),
        (SupersededError(ATTEMPT, Fence("uid-1", 2)), 75),
        (StoreCredentialsError("p", "f"), 2),
        (BucketMissingError("p", "f"), 2),
        (InvalidSpecError(["x"]), 2),
        (ValueError("bug"), 1),
    ],
)
def test_the_drivers_exit_code_follows_the_cause(error: BaseException, code: int) -> None:
    assert attempt_exit_code(error) == code


def test_the_exit_codes_are_the_contracts() -> None:
    assert (EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INFRASTRUCTURE) == (1, 2, 75)  # 75: EX_TEMPFAIL, "try again"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotFoundError("p", "f"), 3),
        (BucketMissingError("p", "f"), 3),
        (CommandFailedError("p", "f"), 1),
        (CorruptCheckpointError("p", "f"), 1),
        (StoreCredentialsError("p", "f"), 1),
        (StoreRequestError("p", "f"), 1),
        # Infrastructure is a failure of what the command set out to do, never bad input.
        (StoreUnreachableError("p", "f"), 1),
        (CheckpointUploadError("p", "f"), 1),
        (CheckpointAbandonedError("p", "f"), 1),
        (SupersededError(ATTEMPT, Fence("uid-1", 2)), 1),
        (InvalidUriError("p", "f"), 2),
        (SpotrayError("p", "f"), 2),
    ],
)
def test_the_commands_exit_codes_read_the_same_classification(error: SpotrayError, code: int) -> None:
    assert exit_code_for(error) == code
