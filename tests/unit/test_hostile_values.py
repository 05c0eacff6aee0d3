"""Values inside the size bounds but outside any sane range, read by the controller from the bucket.

The run's owner can write every object the controller reads (progress, manifests). Before these
tests, a progress object with ``"updated": 1e300`` raised OverflowError in every reconcile of the
run (datetime.fromtimestamp), and a NaN loss went into a status patch as bare ``NaN``, which is not
JSON and which the API server refuses. Each field read has its test here: an out-of-range value
makes the object unreadable (as a malformed one is), and a non-finite loss, a real thing when
training diverges, is shown as no loss rather than as invalid JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotray.contract.attempts import AttemptId
from spotray.contract.checkpoint_key import CheckpointKey
from spotray.contract.errors import Cause, CorruptCheckpointError, cause_of
from spotray.contract.status import LastCheckpoint, Progress
from spotray.contract.uris import parse_uri
from spotray.controller.run_store import interval_losses_status, progress_status
from spotray.train.checkpoints.checkpoint import Manifest
from spotray.train.records.attempt_records import FENCE_KEY, read_fence
from spotray.train.records.progress_log import AttemptProgress, parse_attempt_progress
from spotray.train.storage.store import StoreConfig, describe_failure, open_store

pytestmark = pytest.mark.unit

ATTEMPT = AttemptId("run-1", 1)
NOW = 1_795_773_178.0


def progress_object(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "run_id": ATTEMPT.run_id,
        "attempt": ATTEMPT.attempt,
        "resumed_from": 20,
        "max_steps": 100,
        "world_size": 2,
        "started": NOW,
        "updated": NOW + 10,
        "points": [[21, 2.5, NOW + 5], [22, 2.4, NOW + 10]],
        "restarts": [[20, NOW + 1]],
        "checkpoint_stalls": [[20, 0.5, NOW + 2]],
    }
    return {**good, **changes}


def parsed(obj: dict[str, Any]) -> AttemptProgress | None:
    return parse_attempt_progress(json.dumps(obj).encode(), ATTEMPT, None)


def test_a_well_formed_progress_object_is_read() -> None:
    progress = parsed(progress_object())
    assert progress is not None
    assert progress.last_step == 22


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("updated", 1e300),
        ("updated", -1.0),
        ("started", 1e300),
        ("resumed_from", -5),
        ("resumed_from", 2**70),
        ("resumed_from", "20"),
        ("resumed_from", 1.5),
        ("max_steps", 2**70),
        ("max_steps", True),
        ("world_size", 0),
        ("world_size", 2**70),
        ("points", [[21, 2.5, 1e300]]),
        ("points", [[-1, 2.5, NOW]]),
        ("points", [[2**70, 2.5, NOW]]),
        ("restarts", [[20, 1e300]]),
        ("restarts", [[-20, NOW]]),
        ("checkpoint_stalls", [[20, 1e300, NOW]]),
        ("checkpoint_stalls", [[20, -1.0, NOW]]),
        ("checkpoint_stalls", [[20, 0.5, -1e300]]),
    ],
)
def test_a_value_out_of_range_makes_the_progress_unreadable_never_an_exception(field: str, value: object) -> None:
    assert parsed(progress_object(**{field: value})) is None


@pytest.mark.parametrize("loss", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_loss_is_no_loss_in_the_status_and_the_status_is_json(loss: str) -> None:
    text = json.dumps(progress_object()).replace("2.4", loss)
    progress = parse_attempt_progress(text.encode(), ATTEMPT, None)
    assert progress is not None
    assert progress.last_step == 22
    status, _ = progress_status(progress)
    assert isinstance(status, Progress)
    assert status.loss is None
    json.dumps(status.to_status(), allow_nan=False)  # what the API server gets: never bare NaN


def test_a_non_finite_interval_mean_is_not_recorded() -> None:
    """Steps 11-20 diverged (NaN), and losses near float's largest sum to infinity: neither reaches the status."""
    points = [(step, 2.0 if step <= 10 else math.nan, NOW + step) for step in range(1, 21)]
    points += [(step, 1.7e308, NOW + step) for step in range(21, 31)]
    progress = AttemptProgress(attempt=1, run_id="run-1", max_steps=40, updated=NOW + 20, points=points)
    last = LastCheckpoint(step=30, uri="s3://bucket/r/checkpoint-30", time="2026-12-02T00:00:00Z")
    found = interval_losses_status(progress, [10, 20, 30], last, 10)
    assert [entry.step for entry in found] == [10]
    for entry in found:
        json.dumps(entry.to_status(), allow_nan=False)


@pytest.mark.parametrize("created_at", [1e300, -1e300, math.inf, math.nan])
def test_a_manifest_time_out_of_range_is_corrupt(created_at: float) -> None:
    key = CheckpointKey(b"k" * 32)
    manifest = Manifest(step=10, world_size=1, files={}, created_at=created_at)
    with pytest.raises(CorruptCheckpointError):
        Manifest.from_json(manifest.to_json(key), "s3://bucket/r/checkpoint-10/spotray-manifest.json", key)


@pytest.mark.parametrize("step", [-1, 2**70])
def test_a_manifest_step_out_of_range_is_corrupt(step: int) -> None:
    manifest = Manifest(step=step, world_size=1, files={}, created_at=NOW)
    with pytest.raises(CorruptCheckpointError):
        Manifest.from_json(manifest.to_json(), "s3://bucket/r/checkpoint-10/spotray-manifest.json")


def test_a_skewed_clock_is_infrastructure_not_bad_input() -> None:
    """S3 refuses a request signed more than 15 minutes off its own clock: one node's clock, not the run's
    input, and the next attempt (on another node, or after NTP caught up) gets through."""
    skewed = ClientError(
        {
            "Error": {"Code": "RequestTimeTooSkewed", "Message": "The difference is too large."},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        },
        "PutObject",
    )
    error = describe_failure(skewed, StoreConfig(), parse_uri("s3://bucket/r"), "write the progress")
    assert cause_of(error) is Cause.INFRASTRUCTURE
    assert "clock" in str(error)


@pytest.mark.parametrize("changes", [{"attempt": 2**70}, {"attempt": 0}, {"resumed_from": -1}, {"resumed_from": 1.5}])
def test_a_fence_out_of_range_is_no_fence(tmp_path: Path, changes: dict[str, Any]) -> None:
    store = open_store(str(tmp_path / "ckpt"))
    record = {"run_id": "run-1", "attempt": 2, "resumed_from": 10, **changes}
    store.put_bytes(FENCE_KEY, json.dumps(record).encode())
    assert read_fence(store) is None
