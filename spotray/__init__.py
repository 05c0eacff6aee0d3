"""spotray: resumable training on spot machines. The names a training script needs are here.

    from spotray import S3CheckpointCallback, PreemptionNoticeCallback, fetch_resume_checkpoint

Several processes or nodes (torchrun, Ray Train), once the process group is up: every rank calls
``agree_on_resume_point`` instead of ``fetch_resume_checkpoint``, and all end on the same checkpoint,
read from S3 once per run however many nodes there are (docs/resume.md).

``pip install spotray`` is light (the CLI, the TrainingRun contract, the S3 store); the names that
need torch and transformers come with ``spotray[train]``, and asking for one without it raises an
error that says so. Each is imported when first asked for, so ``import spotray`` stays cheap.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from spotray.contract.extras import extra_required

if TYPE_CHECKING:
    from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
    from spotray.train.checkpoints.resume import ResumePoint, agree_on_resume_point, fetch_resume_checkpoint
    from spotray.train.hf.callback import S3CheckpointCallback
    from spotray.train.hf.loadable import trainer_checkpoint_check
    from spotray.train.hf.notice import PreemptionNoticeCallback
    from spotray.train.hf.tensorboard_sync import TensorBoardSync
    from spotray.train.storage.store import ObjectStore, open_store

try:
    __version__ = version("spotray")
except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
    __version__ = "0+unknown"

# name -> (module, the extra it needs; None: the core has it)
_PUBLIC: dict[str, tuple[str, str | None]] = {
    "S3CheckpointCallback": ("spotray.train.hf.callback", "train"),
    "PreemptionNoticeCallback": ("spotray.train.hf.notice", "train"),
    "AsyncSaveTrainer": ("spotray.train.checkpoints.async_checkpoint", "train"),
    "fetch_resume_checkpoint": ("spotray.train.checkpoints.resume", "train"),
    "agree_on_resume_point": ("spotray.train.checkpoints.resume", "train"),
    "ResumePoint": ("spotray.train.checkpoints.resume", "train"),
    "trainer_checkpoint_check": ("spotray.train.hf.loadable", "train"),
    "TensorBoardSync": ("spotray.train.hf.tensorboard_sync", "train"),
    "open_store": ("spotray.train.storage.store", None),
    "ObjectStore": ("spotray.train.storage.store", None),
}

__all__ = [
    "AsyncSaveTrainer",
    "ObjectStore",
    "PreemptionNoticeCallback",
    "ResumePoint",
    "S3CheckpointCallback",
    "TensorBoardSync",
    "__version__",
    "agree_on_resume_point",
    "fetch_resume_checkpoint",
    "open_store",
    "trainer_checkpoint_check",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'spotray' has no attribute {name!r}")
    module_name, extra = _PUBLIC[name]
    if extra is None:
        module = importlib.import_module(module_name)
    else:
        with extra_required(extra):
            module = importlib.import_module(module_name)
    value = getattr(module, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
