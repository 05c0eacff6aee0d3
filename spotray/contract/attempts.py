"""The attempt contract: what the job, the controller and local mode agree on about one attempt.

Identity. A run has an id: the TrainingRun's UID under the controller, an id kept in the work
directory in local mode, a fresh one for a job started by hand. The controller and local mode pass
it to the job in ``SPOTRAY_RUN`` (spotray/contract/spec.py ``RunContext``) with the attempt's number. Every
record an attempt writes lives under its run's id and names the attempt inside, and a reader
ignores a record whose identity is not the one it asked for: a run re-created with the same
checkpoint URI, or a finished local run started again, never reads another run's records.

Layout under the run's checkpoint URI (checkpoints themselves: train/checkpoints/checkpoint.py)::

    _spotray/<run id>/attempt-<N>.json            how attempt N ended (the driver, train/launch/launcher.py)
    _spotray/<run id>/attempt-<N>.preempted.json  rank 0 stopped on a preemption notice, its
                                                  emergency checkpoint complete (train/hf/notice.py)
    _spotray/<run id>/attempt-<N>.progress.json   training progress (rank 0, train/records/progress_log.py)
    _spotray/fence.json                           the newest attempt to start; older ones stop writing

Exit codes (the job driver's and the ``spotray`` command's), outcomes of an attempt and the bound
on a record's size are defined here, once; reading and writing the records and the fence is
train/records/attempt_records.py.
"""

from __future__ import annotations

import re
import signal
import uuid
from dataclasses import dataclass, field
from typing import Any

from spotray.contract.errors import Cause, SpotrayError, cause_of

RECORDS_PREFIX = "_spotray"
FENCE_KEY = f"{RECORDS_PREFIX}/fence.json"
# Records (outcomes, preemption markers, the fence) are a few hundred bytes and a dozen JSON values:
# a larger one was not written by us, and the bounds keep a hostile object out of the controller's
# memory (spotray/contract/bounded_json.py). An outcome's detail is cut to fit (MAX_DETAIL_CHARS).
MAX_RECORD_BYTES = 1 << 20
MAX_RECORD_VALUES = 1_000
MAX_DETAIL_CHARS = 64_000

# Exit codes, one set for the job's driver (train/launch/launcher.py; the controller and local mode
# read them to tell how an attempt ended), the ``spotray`` command (scripts may rely on them:
# spotray/cli/exit_codes.py says which error gives which) and the controller process.
EXIT_OK = 0  # the driver: training finished; the command: done
# The driver: training failed (counts against maxFailures). The command: what it set out to do
# failed (a run failed, a checkpoint is incomplete or corrupt, S3 or the cluster refused).
EXIT_FAILED = 1
# Bad input: a spec, a URI, a flag, credentials or a bucket is wrong. The driver's fails the run
# at once (a retry would be refused the same way).
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3  # the command: no such run, checkpoint or bucket
# The driver: an infrastructure fault ended the attempt (the store did not answer or kept failing, a
# checkpoint upload failed, a newer attempt took over, Ray's cluster failed): nobody's input and not
# the training code, so no budget is spent and the attempt is tried again after a backoff
# (spotray/decisions/run_plan.py). 75 is EX_TEMPFAIL of sysexits.h: "try again later". An entrypoint of
# the user's own that exits 75 asks for the same.
EXIT_INFRASTRUCTURE = 75
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: the command was stopped by Ctrl-C
EXIT_PREEMPTED = 128 + signal.SIGTERM  # 143: the driver stopped on a notice after a complete emergency checkpoint

# The driver's exit code for what ended its attempt, by whose it is to fix (spotray/contract/errors.py).
_EXIT_FOR_CAUSE = {
    Cause.BAD_INPUT: EXIT_BAD_INPUT,
    Cause.INFRASTRUCTURE: EXIT_INFRASTRUCTURE,
    Cause.TRAINING: EXIT_FAILED,
}


def exit_code_for_cause(cause: Cause) -> int:
    """2 for bad input, 75 for an infrastructure fault, 1 for a failure of the training code."""
    return _EXIT_FOR_CAUSE[cause]


def attempt_exit_code(error: BaseException) -> int:
    """The driver's exit code when ``error`` ended its attempt (``cause_of``, then ``exit_code_for_cause``)."""
    return exit_code_for_cause(cause_of(error))


# How an attempt ended: status.attempts[].outcome. Interrupted: an infrastructure fault ended it,
# which spends no budget (reason InfrastructureFault, spotray/decisions/run_plan.py).
OUTCOME_RUNNING, OUTCOME_SUCCEEDED, OUTCOME_PREEMPTED, OUTCOME_FAILED, OUTCOME_SUSPENDED, OUTCOME_INTERRUPTED = (
    "Running",
    "Succeeded",
    "Preempted",
    "Failed",
    "Suspended",
    "Interrupted",
)
OUTCOMES = (
    OUTCOME_RUNNING,
    OUTCOME_SUCCEEDED,
    OUTCOME_PREEMPTED,
    OUTCOME_FAILED,
    OUTCOME_SUSPENDED,
    OUTCOME_INTERRUPTED,
)

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def check_run_id(run_id: str) -> str:
    """A run id becomes an S3 key segment: plain characters only, at most 64."""
    if not RUN_ID_PATTERN.match(run_id):
        raise SpotrayError(
            f"run id {run_id!r} is not a plain name (letters, digits, '.', '_', '-'; at most 64)",
            "let the controller or `spotray run` set SPOTRAY_RUN; do not write it by hand",
        )
    return run_id


@dataclass(frozen=True)
class AttemptId:
    """Which attempt of which run: the identity every record carries."""

    run_id: str
    attempt: int
    # On its way out: a notice stops it, and it writes only its emergency checkpoint. Such an attempt
    # never takes the URI over or back from another run (train/records/attempt_records.py
    # ``check_fence``): that run is the one that goes on, e.g. the run created again after this one's
    # was deleted. Not part of the identity.
    leaving: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.attempt < 1:
            raise ValueError(f"attempt numbers count from 1, got {self.attempt}")

    def _key(self, suffix: str) -> str:
        return f"{RECORDS_PREFIX}/{self.run_id}/attempt-{self.attempt}{suffix}"

    @property
    def outcome_key(self) -> str:
        return self._key(".json")

    @property
    def preemption_key(self) -> str:
        return self._key(".preempted.json")

    @property
    def progress_key(self) -> str:
        return self._key(".progress.json")

    def identity(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "attempt": self.attempt}

    def __str__(self) -> str:
        return f"attempt {self.attempt} of run {self.run_id}"


# ------------------------------------------------------------------ what the records say


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended, as its driver saw it: the exit code and what a person should read."""

    exit_code: int
    step: int | None
    detail: str


@dataclass(frozen=True)
class AttemptRecords:
    """What the job wrote about one attempt (each None when absent or not this attempt's)."""

    outcome: dict[str, Any] | None = None
    preempted: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int | None:
        code = (self.outcome or {}).get("exit_code")
        return code if isinstance(code, int) else None


@dataclass(frozen=True)
class Fence:
    """The newest attempt to start on this checkpoint URI, and the step it resumed from."""

    run_id: str
    attempt: int
    resumed_from: int | None = None

    def holds(self, attempt: AttemptId) -> bool:
        return (self.run_id, self.attempt) == (attempt.run_id, attempt.attempt)
