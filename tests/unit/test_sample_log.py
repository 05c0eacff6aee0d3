"""The sample log behind the no-duplicate, no-gap checks: what is recorded, and which record counts."""

import json
from pathlib import Path

import pytest
import torch

from spotray.train.hf.data import SampleRecorder, new_worker_group_id, trained_batches

pytestmark = [pytest.mark.unit]


def features(sample: dict) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([sample["sample_id"]])}


def train_steps(
    log: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    attempt: int,
    start: int,
    batches: list[list[int]],
    ranks: tuple[int, ...] = (0, 1),
    accumulation: int = 1,
) -> None:
    """One worker group of ``ranks`` training ``batches`` (one per pass) from checkpoint ``start``."""
    monkeypatch.setenv("SPOTRAY_SAMPLE_LOG", str(log))
    group = new_worker_group_id()
    for rank in ranks:
        recorder = SampleRecorder(
            features, rank=rank, start_step=start, attempt=attempt, accumulation=accumulation, group=group
        )
        for batch in batches:
            recorder([{"sample_id": 10 * sample_id + rank} for sample_id in batch])


def test_a_step_trained_again_counts_as_its_newest_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "samples"
    train_steps(log, monkeypatch, attempt=1, start=0, batches=[[1], [2], [3]])  # steps 1-3, killed after 3
    train_steps(log, monkeypatch, attempt=1, start=0, batches=[[1], [2]])  # a worker group restarted from 0
    train_steps(log, monkeypatch, attempt=2, start=2, batches=[[30], [4]])  # the next attempt, from checkpoint-2
    assert trained_batches(log) == {1: [10, 11], 2: [20, 21], 3: [300, 301], 4: [40, 41]}


def test_every_pass_of_an_accumulated_step_counts_and_a_newer_group_replaces_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "samples"
    # two workers, one pass a step: steps 1-2
    train_steps(log, monkeypatch, attempt=1, start=0, batches=[[1], [2]])
    # one worker left: the group restarts from checkpoint-1 in the same attempt, two passes a step
    train_steps(log, monkeypatch, attempt=1, start=1, batches=[[2], [3], [4], [5]], ranks=(0,), accumulation=2)
    # the same attempt restarts once more from checkpoint-1 (same file name), and is killed after one
    # pass: its step 2 replaces both ranks' step 2 of the first group, and the second group's
    train_steps(log, monkeypatch, attempt=1, start=1, batches=[[7]], ranks=(0,), accumulation=2)
    assert trained_batches(log) == {1: [10, 11], 2: [70], 3: [40, 50]}


def test_a_line_cut_off_by_a_kill_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "samples"
    train_steps(log, monkeypatch, attempt=1, start=0, batches=[[1]])
    torn = log / "attempt-1-start-0-rank-0.jsonl"
    torn.write_text(torn.read_text() + json.dumps({"step": 2, "rank": 0, "t": 1.0, "ids": [5], "group": "g"})[:20])
    assert trained_batches(log) == {1: [10, 11]}


def test_nothing_is_recorded_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTRAY_SAMPLE_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    batch = SampleRecorder(features, rank=0, start_step=0, attempt=1)([{"sample_id": 7}])
    assert batch["input_ids"].tolist() == [[7]]
    assert not list(tmp_path.iterdir())
