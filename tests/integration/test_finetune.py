"""Your own pretrained model, fine-tuned whole or with LoRA (issue #72, item 6), logged to TensorBoard as
one run across attempts (item 5): jobs/finetune loads a ``from_pretrained`` directory, checkpoints
through the S3 callback to a real S3 server (SeaweedFS), and a run stopped after a checkpoint and
started again ends with the weights of a run never stopped.

With LoRA the checkpoints hold the adapters alone (the frozen base is the pretrained directory's),
and the resume check must accept them: a checkpoint this model cannot load would be skipped and the
run would silently train from step 0.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotray.jobs.finetune.train import main
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.hf.tensorboard_sync import PREFIX
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


def scalar_steps(event_file: bytes, tag: str) -> list[int]:
    """The steps of ``tag``'s scalars in a TensorBoard event file (TFRecord framing: length, its CRC,
    the Event, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415 - shipped with Ray Train's tensorboardX

    steps, offset = [], 0
    while offset < len(event_file):
        (length,) = struct.unpack_from("<Q", event_file, offset)
        event = Event.FromString(event_file[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
        steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


def test_tensorboard_logs_are_one_run_across_attempts(
    s3_server: LocalS3Server, s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #72, item 5: an attempt stopped after checkpoint 20 and another on a fresh machine (a new
    work directory): the second starts with the first's event file in its log directory, and the store
    ends with both, holding every logged step."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)

    def run(workdir: str, *callbacks: Any) -> Path:
        argv = ["--checkpoint-uri", s3_uri, "--pretrained", str(tmp_path / "pretrained"), "--make-pretrained",
                "--max-steps", str(STEPS), "--save-steps", str(EVERY), "--data-bytes", "40000",
                "--workdir", str(tmp_path / workdir), "--tensorboard"]  # fmt: skip
        assert main(argv, extra_callbacks=list(callbacks)) == 0
        return tmp_path / workdir / "tensorboard"

    first = run("first", StopAfter(STOP_AT))
    assert len(list(first.glob("events.out.tfevents.*"))) == 1
    second = run("second")
    local = sorted(second.glob("events.out.tfevents.*"))
    assert len(local) == 2, "the first attempt's file came back beside the second's"

    store = open_store(s3_uri)
    kept = {info.key: store.get_bytes(info.key) for info in store.list(PREFIX)}
    assert len(kept) == 2, sorted(kept)
    steps = sorted(scalar_steps(data, "train/loss") for data in kept.values())
    assert steps == [[10, 20], [30]], "attempt 1 logged 10 and 20 before it stopped; attempt 2 logged 30"
