"""Your own pretrained model, fine-tuned whole or with LoRA (issue #72, item 6): jobs/finetune loads a
``from_pretrained`` directory, checkpoints through the S3 callback to a real S3 server (SeaweedFS),
and a run stopped after a checkpoint and started again ends with the weights of a run never stopped.

With LoRA the checkpoints hold the adapters alone (the frozen base is the pretrained directory's),
and the resume check must accept them: a checkpoint this model cannot load would be skipped and the
run would silently train from step 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.jobs.finetune.train import main
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import open_store

pytestmark = pytest.mark.integration

STEPS, EVERY, STOP_AT = 30, 10, 20


class StopAfter(TrainerCallback):
    """Ends training after the save of ``step``, as a preemption right after a checkpoint would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def weights(uri: str, workdir: Path) -> dict[str, torch.Tensor]:
    """The tensors of the newest complete checkpoint under ``uri`` (model or adapters), fetched."""
    store = open_store(uri)
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.manifest is not None
    assert latest.step == STEPS
    name = next(n for n in ("adapter_model.safetensors", "model.safetensors") if n in latest.manifest.files)
    local = workdir / f"{uri.rsplit('/', 1)[-1]}-{name}"
    local.write_bytes(store.get_bytes(f"{latest.prefix.rstrip('/')}/{name}"))
    return load_file(local)


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["whole-model", "lora"])
def test_a_fine_tune_stopped_after_a_checkpoint_ends_as_one_never_stopped(
    s3_server: LocalS3Server, s3_uri: str, tmp_path: Path, lora_rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    pretrained = tmp_path / "pretrained"

    def run(uri: str, workdir: str, *callbacks: Any) -> None:
        argv = ["--checkpoint-uri", uri, "--pretrained", str(pretrained), "--make-pretrained",
                "--lora-rank", str(lora_rank), "--max-steps", str(STEPS), "--save-steps", str(EVERY),
                "--data-bytes", "40000", "--workdir", str(tmp_path / workdir)]  # fmt: skip
        assert main(argv, extra_callbacks=list(callbacks)) == 0

    run(f"{s3_uri}/straight", "straight")
    run(f"{s3_uri}/stopped", "first", StopAfter(STOP_AT))
    stopped = latest_complete_checkpoint(open_store(f"{s3_uri}/stopped"))
    assert stopped is not None
    assert stopped.step == STOP_AT
    run(f"{s3_uri}/stopped", "second")  # a new process would do the same: fetch, resume, go on

    straight, resumed = weights(f"{s3_uri}/straight", tmp_path), weights(f"{s3_uri}/stopped", tmp_path)
    assert set(straight) == set(resumed)
    if lora_rank:
        assert all("lora_" in name for name in straight), "adapters only: the base stays the pretrained one"
    base = load_file(pretrained / "model.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6, msg=name)
    changed = [n for n, t in straight.items() if n in base and not torch.equal(t, base[n])]
    assert lora_rank or changed, "a whole-model fine-tune moved the pretrained weights"
