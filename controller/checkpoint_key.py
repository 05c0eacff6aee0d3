"""A run's checkpoint key Secret (pure): what lets its jobs tell their checkpoints from forged ones.

Made by the controller before the run's first RayJob, in the run's namespace, owned by the run (the
garbage collector deletes it with the run), immutable, with 32 random bytes as hex under one data
key. Every Ray container of every attempt gets it as ``SPOTRAY_CHECKPOINT_KEY``
(spotray/contract/checkpoint_key.py) through a ``secretKeyRef`` that the kubelet resolves
(controller/rayjob.py ``checkpoint_key_env``): the controller writes the key once and never reads
it back, and it is never in the RayJob, the runtime env or a status.

A sweep's trials share one key, their sweep's (``<sweep>-sweep-checkpoint-key``, owned by the
sweep): population-based training resumes a trial from another trial's checkpoint, whose manifest
its job must be able to check. The first trial to start makes it; the others find it, the sweep's.

Only the first attempt makes it: a run started before the controller made keys, or whose key was
deleted, goes on without one (its jobs neither sign nor check, ``optional: true`` on the reference)
rather than with a new key that would refuse every checkpoint the run already has. A Secret of that
name already there is the run's own if the run owns it (the controller stopped between making it and
the RayJob); one owned by anything else (a deleted run of the same name whose Secret the garbage
collector has not removed yet, or a Secret a user made) holds the RayJob back, saying so
(controller/ownership.py).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from spotray.contract.names import CHECKPOINT_KEY_SECRET_DATA_KEY, RUN_LABEL, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.spec import TrainingRun
from spotray.controller.rayjob import MANAGED_BY, owner_reference

KEY_BYTES = 32


def new_checkpoint_key() -> str:
    """A fresh key, as the hex that ``SPOTRAY_CHECKPOINT_KEY`` holds."""
    return secrets.token_hex(KEY_BYTES)


def key_owner_uid(run: TrainingRun, run_uid: str) -> str:
    """Whose the run's key Secret is: the run's, or a trial's sweep's (one key for all its trials)."""
    return run.sweep.uid if run.sweep is not None else run_uid


def build_checkpoint_key_secret(run: TrainingRun, run_uid: str, key: str) -> dict[str, Any]:
    """The Secret that holds ``run``'s checkpoint key; a trial's is its sweep's, owned by the sweep and made
    by whichever trial starts first (the others find it there, the sweep's own)."""
    if run.sweep is not None:
        labels = {SWEEP_LABEL: run.sweep.name, **MANAGED_BY}
        owner = {**owner_reference(run.sweep.name, run.sweep.uid), "kind": SWEEP_KIND}
    else:
        labels, owner = {RUN_LABEL: run.name, **MANAGED_BY}, owner_reference(run.name, run_uid)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": run.checkpoint_key_secret,
            "namespace": run.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {CHECKPOINT_KEY_SECRET_DATA_KEY: base64.b64encode(key.encode()).decode()},
    }
