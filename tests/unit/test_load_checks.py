"""The jobs' ``LoadCheck``s on local files: what they refuse as the checkpoint's fault, with the reason.

The Trainer's check against real checkpoints in a real store, and the fallback it drives, are in
tests/integration/test_unloadable_checkpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from spotray.contract.errors import UnloadableCheckpointError
from spotray.jobs.cnn.train import STATE_NAME, SmallCnn, state_check
from spotray.train.checkpoints.checkpoint import Manifest
from spotray.train.checkpoints.resume import ResumePoint
from spotray.train.hf.loadable import trainer_checkpoint_check

pytestmark = pytest.mark.unit


def point(directory: Path, step: int = 7, resume: dict[str, int] | None = None) -> ResumePoint:
    manifest = Manifest(step=step, world_size=1, files={}, created_at=0.0, resume=resume or {})
    return ResumePoint(step, directory, manifest, f"s3://b/run/checkpoint-{step}")


def cnn_state(directory: Path, image_size: int, **changes: object) -> ResumePoint:
    model = SmallCnn(image_size)
    optimizer = torch.optim.Adam(model.parameters())
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 0, "step": 7, **changes}
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(state, directory / STATE_NAME)
    return point(directory, resume={"epochs_done": 1})


def test_the_cnn_check_passes_its_own_state(tmp_path: Path) -> None:
    state_check(28)(cnn_state(tmp_path, 28))


@pytest.mark.parametrize(
    ("changes", "image_size", "reason"),
    [
        ({}, 32, "size mismatch"),  # another image size: the classifier's shape differs
        ({"optimizer": None}, 28, "TypeError"),
        ({"model": {"other.weight": torch.zeros(1)}}, 28, "Missing key"),
    ],
    ids=["another-image-size", "no-optimizer-state", "another-model"],
)
def test_the_cnn_check_refuses_a_state_that_does_not_fit(
    tmp_path: Path, changes: dict[str, object], image_size: int, reason: str
) -> None:
    with pytest.raises(UnloadableCheckpointError) as caught:
        state_check(image_size)(cnn_state(tmp_path, 28, **changes))
    assert caught.value.problem.startswith(f"{STATE_NAME} cannot be read")
    assert reason in caught.value.problem


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def trainer_dir(directory: Path, step: int = 7) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    safetensors.torch.save_model(tiny_model(), str(directory / "model.safetensors"))
    return directory


def test_the_trainer_check_passes_a_checkpoint_of_its_model(tmp_path: Path) -> None:
    trainer_checkpoint_check(tiny_model())(point(trainer_dir(tmp_path)))


def test_the_trainer_check_refuses_a_checkpoint_without_a_trainer_state(tmp_path: Path) -> None:
    (trainer_dir(tmp_path) / "trainer_state.json").unlink()
    with pytest.raises(UnloadableCheckpointError, match="would count from step 0"):
        trainer_checkpoint_check(tiny_model())(point(tmp_path))


def test_the_trainer_check_refuses_a_checkpoint_without_weights(tmp_path: Path) -> None:
    (trainer_dir(tmp_path) / "model.safetensors").unlink()
    with pytest.raises(UnloadableCheckpointError, match="no model weights"):
        trainer_checkpoint_check(tiny_model())(point(tmp_path))


def test_the_trainer_check_leaves_fsdp_checkpoints_to_their_loader(tmp_path: Path) -> None:
    (trainer_dir(tmp_path) / "model.safetensors").unlink()
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    trainer_checkpoint_check(tiny_model())(point(tmp_path))


def test_the_trainer_check_refuses_weights_with_no_name_of_the_model(tmp_path: Path) -> None:
    trainer_dir(tmp_path)
    safetensors.torch.save_file({"encoder.weight": torch.zeros(3, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnloadableCheckpointError, match="none of its 1 weights is a parameter of this model"):
        trainer_checkpoint_check(tiny_model())(point(tmp_path))


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/shard.safetensors", ".."])
def test_the_trainer_check_reads_no_shard_outside_the_checkpoint(tmp_path: Path, shard: str) -> None:
    directory = trainer_dir(tmp_path / "checkpoint")
    (directory / "model.safetensors").unlink()
    safetensors.torch.save_model(tiny_model(), str(tmp_path / "outside.safetensors"))
    index = {"weight_map": {"0.weight": shard}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnloadableCheckpointError, match="does not name its shards as files beside it"):
        trainer_checkpoint_check(tiny_model())(point(directory))
