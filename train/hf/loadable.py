"""Can the Trainer load this checkpoint into this model? Asked before training, so resume can fall back.

A checkpoint's bytes are verified against its manifest when it is fetched, but the manifest only
says the bytes are the ones written, not that this job can load them. The Trainer loads inside
``Trainer.train``, where a failure ends the attempt and spends the failure budget, once per attempt,
until the run fails. ``trainer_checkpoint_check(model)`` asks the same questions first, cheaply, and
raises ``UnloadableCheckpointError`` with the answer (train/checkpoints/resume.py then skips the
checkpoint for an older one):

- ``trainer_state.json`` parses and is at the checkpoint's step (without it the Trainer would count
  again from step 0);
- every weights file's header parses and covers the file (``safe_open`` checks that without reading
  the tensors), its tensors are the model's and have the model's shapes;
- the optimizer and scheduler states unpickle with ``weights_only`` (memory-mapped: the tensors are
  not read), as the Trainer's own loads do.

A checkpoint with no weights at all is refused, as the Trainer would. Other layouts (FSDP's sharded
state, DeepSpeed's, PEFT adapters, pickled ``pytorch_model.bin``) are left to their own loaders.
``training_args.bin`` and the RNG states are never unpickled by this check.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from spotray.contract.errors import UnloadableCheckpointError
from spotray.train.checkpoints.resume import UNLOADABLE_FIX, LoadCheck, ResumePoint, load_torch_file, read_or_refuse

# Layouts whose loaders judge the weights themselves: FSDP's sharded state, DeepSpeed's, PEFT adapters,
# and the pickled weights of old checkpoints (the Trainer loads those through its own rules).
_OTHER_LAYOUTS = ("pytorch_model_fsdp", "global_step", "adapter_model")


def trainer_checkpoint_check(model: torch.nn.Module) -> LoadCheck:
    """A ``LoadCheck`` for checkpoints the Hugging Face Trainer writes, against ``model`` (built, not yet wrapped)."""
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}

    def check(point: ResumePoint) -> None:
        directory = point.local_dir
        _check_trainer_state(directory, point.step)
        _check_weights(directory, shapes)
        for name in (OPTIMIZER_NAME, SCHEDULER_NAME):
            if (directory / name).is_file():
                read_or_refuse(name, partial(load_torch_file, directory / name))

    return check


def _check_trainer_state(directory: Path, step: int) -> None:
    path = directory / TRAINER_STATE_NAME
    if not path.is_file():
        raise UnloadableCheckpointError(
            f"it has no {TRAINER_STATE_NAME}: the Trainer would count from step 0", UNLOADABLE_FIX
        )
    state = read_or_refuse(TRAINER_STATE_NAME, lambda: json.loads(path.read_bytes()))
    global_step = state.get("global_step") if isinstance(state, dict) else None
    if global_step != step:
        raise UnloadableCheckpointError(
            f"its {TRAINER_STATE_NAME} is at step {global_step!r}, its manifest at step {step}", UNLOADABLE_FIX
        )


def _weights_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: the one file, or the shards its index names; none in other layouts."""
    if (directory / SAFE_WEIGHTS_NAME).is_file():
        return [directory / SAFE_WEIGHTS_NAME]
    index = directory / SAFE_WEIGHTS_INDEX_NAME
    if not index.is_file():
        other = [WEIGHTS_NAME, WEIGHTS_INDEX_NAME, *_OTHER_LAYOUTS]
        if not any(entry.name.startswith(prefix) for entry in directory.iterdir() for prefix in other):
            raise UnloadableCheckpointError(
                f"it has no model weights ({SAFE_WEIGHTS_NAME} or another layout)", UNLOADABLE_FIX
            )
        return []
    weight_map = read_or_refuse(SAFE_WEIGHTS_INDEX_NAME, lambda: json.loads(index.read_bytes())["weight_map"])
    shards = sorted({str(shard) for shard in weight_map.values()}) if isinstance(weight_map, dict) else []
    # A shard's name comes from the checkpoint: only plain names in the checkpoint's own directory.
    if not shards or any(Path(shard).name != shard or shard in {".", ".."} for shard in shards):
        raise UnloadableCheckpointError(
            f"{SAFE_WEIGHTS_INDEX_NAME} does not name its shards as files beside it", UNLOADABLE_FIX
        )
    return [directory / shard for shard in shards]


def _check_weights(directory: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    found: dict[str, tuple[int, ...]] = {}
    for path in _weights_files(directory):

        def header(path: Path = path) -> dict[str, tuple[int, ...]]:
            with safe_open(str(path), framework="pt") as weights:
                return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118

        found.update(read_or_refuse(path.name, header))
    if not found:
        return  # a layout other loaders judge (_OTHER_LAYOUTS)
    mismatched = [name for name, shape in found.items() if name in shapes and shapes[name] != shape]
    if mismatched:
        name = mismatched[0]
        raise UnloadableCheckpointError(
            f"its weight {name} has shape {list(found[name])}, this model's {list(shapes[name])} "
            f"({len(mismatched)} of {len(found)} differ): another model's checkpoint",
            UNLOADABLE_FIX,
        )
    if not any(name in shapes for name in found):
        raise UnloadableCheckpointError(
            f"none of its {len(found)} weights is a parameter of this model (it has {next(iter(found))}): "
            "another model's checkpoint",
            UNLOADABLE_FIX,
        )
