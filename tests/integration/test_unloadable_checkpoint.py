"""Resume falls back past a checkpoint that fetches and verifies but cannot be loaded (issue #36, item 2).

Real Trainer checkpoints of the GPT-2 job in a real SeaweedFS: the newest is rewritten with a
manifest that matches its new bytes (what another job, or a damaged save, leaves), so fetching and
verifying it succeeds. The Trainer's own load then fails inside ``Trainer.train``, where it used to
end every attempt and spend the failure budget until the run failed. With the job's ``LoadCheck``
(``trainer_checkpoint_check``), rank 0 skips it with a warning and every rank resumes from the
older one, which the Trainer then loads and trains on; when none loads the run fails at once as
bad input.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import safetensors.torch
import torch
from transformers import Trainer

from spotray.contract.errors import Cause, UnloadableCheckpointError, cause_of
from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.train import build_model, build_trainer
from spotray.train.checkpoints.checkpoint import complete_checkpoints, download_checkpoint, upload_checkpoint
from spotray.train.checkpoints.resume import LoadCheck, ResumeFetch
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.loadable import trainer_checkpoint_check
from spotray.train.storage.store import S3ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Gpt2JobConfig(workdir=Path("unused"), max_steps=10, batch_size=4, n_embd=64, async_checkpoints=False)


class Pickled:
    """Any object but tensors: a weights_only load refuses it (it would run code on a plain load)."""


def another_models_weights(directory: Path) -> None:
    other = build_model(replace(JOB, n_embd=32))
    (directory / "model.safetensors").unlink()
    safetensors.torch.save_model(other, str(directory / "model.safetensors"))


def truncated_weights(directory: Path) -> None:
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4096])


def pickled_optimizer(directory: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"state": {}, "param_groups": [], "payload": Pickled()}, buffer)
    (directory / "optimizer.pt").write_bytes(buffer.getvalue())


def trainer_state_at_another_step(directory: Path) -> None:
    path = directory / "trainer_state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "global_step": 3}))


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "another-model": (another_models_weights, "has shape"),
    "truncated-weights": (truncated_weights, "model.safetensors cannot be read"),
    "pickled-optimizer": (pickled_optimizer, "optimizer.pt cannot be read"),
    "state-at-another-step": (trainer_state_at_another_step, "is at step 3, its manifest at step"),
}


def train_checkpoints(store: S3ObjectStore, workdir: Path) -> None:
    job = replace(JOB, workdir=workdir)
    callback = S3CheckpointCallback(str(store.uri), store=store, staging_dir=workdir / "staging")
    build_trainer(job, [callback], save_steps=5).train()
    assert [info.step for info in complete_checkpoints(store)] == [10, 5]


def rewrite(store: S3ObjectStore, step: int, damage: Callable[[Path], None], workdir: Path) -> None:
    """Damage checkpoint-``step`` and upload it again with a manifest that matches the damaged bytes."""
    info = next(info for info in complete_checkpoints(store) if info.step == step)
    local = download_checkpoint(store, info, workdir / "rewrite")
    copy = workdir / f"damaged-{step}"
    shutil.copytree(local, copy, ignore=shutil.ignore_patterns("spotray-verified.json"))
    damage(copy)
    upload_checkpoint(store, copy, step, world_size=1)


def trainer_for(workdir: Path, max_steps: int) -> Trainer:
    return build_trainer(replace(JOB, workdir=workdir, max_steps=max_steps), [], save_steps=0)


def check_for(trainer: Trainer) -> LoadCheck:
    assert trainer.model is not None
    return trainer_checkpoint_check(trainer.model)


@pytest.mark.parametrize("damage", DAMAGES, ids=str)
def test_a_checkpoint_the_trainer_cannot_load_is_skipped_for_the_older_one(
    s3_store: S3ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    train_checkpoints(s3_store, tmp_path / "first")
    how, reason = DAMAGES[damage]
    rewrite(s3_store, 10, how, tmp_path)

    # What an attempt did before: the newest verifies, so it was chosen, and the Trainer's load failed.
    newest = ResumeFetch(s3_store, tmp_path / "node-before").wait()
    assert newest is not None
    assert newest.step == 10
    if damage != "state-at-another-step":  # that one loads, and silently trains from the wrong step
        with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the Trainer's loaders raise
            trainer_for(tmp_path / "before", max_steps=12).train(resume_from_checkpoint=str(newest.local_dir))

    trainer = trainer_for(tmp_path / "after", max_steps=12)
    point = ResumeFetch(s3_store, tmp_path / "node").wait(check_for(trainer))
    assert point is not None
    assert point.step == 5
    skipped = [record.getMessage() for record in caplog.records if "cannot load it" in record.getMessage()]
    assert len(skipped) == 1, skipped
    assert "checkpoint-10" in skipped[0]
    assert reason in skipped[0]
    trainer.train(resume_from_checkpoint=str(point.local_dir))  # the older one loads and trains on
    assert trainer.state.global_step == 12
    copies = [path.name for path in (tmp_path / "node").iterdir() if not path.name.startswith(".")]
    assert copies == ["checkpoint-5"]  # the skipped one's copy is gone: a node keeps one


def test_when_no_checkpoint_loads_the_run_fails_at_once_as_bad_input(s3_store: S3ObjectStore, tmp_path: Path) -> None:
    """Another job's checkpoints under the URI: no fresh start on top of them, and the message says why."""
    train_checkpoints(s3_store, tmp_path / "first")
    for step in (10, 5):
        rewrite(s3_store, step, another_models_weights, tmp_path)
    trainer = trainer_for(tmp_path / "after", max_steps=12)
    with pytest.raises(UnloadableCheckpointError) as caught:
        ResumeFetch(s3_store, tmp_path / "node").wait(check_for(trainer))
    assert cause_of(caught.value) is Cause.BAD_INPUT
    message = str(caught.value)
    assert "checkpoint-10" in message
    assert "checkpoint-5" in message
    assert "checkpoint URI of its own" in message
