"""Optional dependencies: which extra provides what, and the error that says which one to install.

``pip install spotray`` is the light core (the CLI, the TrainingRun contract, the S3 store, the
Kubernetes client of the cluster commands). torch and transformers (the Hugging Face callback,
resume), Ray, MosaicML streaming, the controller and matplotlib come with extras, so a module
that needs one imports it inside ``with extra_required(...)``: a missing package then raises an
error naming the extra, instead of a bare ``ModuleNotFoundError`` deep in a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from spotray.contract.errors import SpotrayError

# extra -> what it is for, as the error message says it
EXTRAS = {
    "train": "the Hugging Face Trainer side (torch, transformers: the checkpoint callback, resume, notices)",
    "ray": "Ray Train (the launcher, local mode and the example jobs)",
    "streaming": "MosaicML streaming datasets",
    "controller": "the TrainingRun controller (kopf, the Prometheus client)",
    "plot": "matplotlib for plots",
    "sweep": "Optuna's samplers and pruners for sweeps (TrainingSweep)",
}


class MissingExtraError(SpotrayError, ImportError):
    """A package of an optional extra is not installed. Also an ``ImportError``, for callers that test for one."""


@contextmanager
def extra_required(extra: str) -> Iterator[None]:
    """Turn a ``ModuleNotFoundError`` raised inside the block into a ``MissingExtraError`` naming ``extra``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {sorted(EXTRAS)}")
    try:
        yield
    except ModuleNotFoundError as missing:
        raise MissingExtraError(
            f"the Python package {missing.name!r} is not installed; it is needed for {EXTRAS[extra]}",
            f"pip install 'spotray[{extra}]'   (or 'spotray[all]' for everything)",
        ) from missing
