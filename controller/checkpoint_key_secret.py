"""The checkpoint key Secret (pure): what lets a namespace's jobs tell their checkpoints from forged ones.

One key per namespace, ``spotray-checkpoint-key``, unless a run's ``spec.checkpoint.keySecret``
names another. The controller makes it before the first RayJob of a run that finds none: immutable,
owned by nothing (deleting a run leaves it, as it leaves the run's checkpoints), 32 random bytes as
hex under one data key. Every Ray container of every attempt gets it as ``SPOTRAY_CHECKPOINT_KEY``
(spotray/contract/checkpoint_key.py) through a ``secretKeyRef`` that the kubelet resolves
(controller/rayjob.py ``checkpoint_key_env``): the controller writes a key once and never reads it
to give it out, and it is never in the RayJob, the runtime env or a status.

Why the namespace, not the run: checkpoints outlive runs. A key made per run and deleted with it
left a run created again on the same URI (what the controller's own messages advise after a budget
runs out) with a new key, which refused every checkpoint there; it trained from step 0 and wrote over
them. A warm start from another run's checkpoint, and a sweep's trials, need the same key too. The
namespace is where Kubernetes draws the line anyway: whoever may start a pod in it may mount its
Secrets. A Secret of that name already there is the key, whoever made it (a user may make it first,
with a key of their own); it is never replaced, since a Secret recreated under the same name
may reach pods as the kubelet's cached old value.

Only a run's first attempt makes it: a run whose key was deleted mid-way goes on without one (its
pods' reference is optional, its jobs neither sign nor check) rather than with a new key that would
refuse every checkpoint the run already has.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from spotray.contract.names import CHECKPOINT_KEY_SECRET_DATA_KEY
from spotray.contract.spec import TrainingRun
from spotray.controller.rayjob import MANAGED_BY

KEY_BYTES = 32


def new_checkpoint_key() -> str:
    """A fresh key, as the hex that ``SPOTRAY_CHECKPOINT_KEY`` holds."""
    return secrets.token_hex(KEY_BYTES)


def build_checkpoint_key_secret(run: TrainingRun, key: str) -> dict[str, Any]:
    """The Secret that holds ``run``'s checkpoint key (its namespace's, or the one its spec names): owned by
    nothing, so that it lives as long as the checkpoints it signed."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": run.checkpoint_key_secret, "namespace": run.namespace, "labels": dict(MANAGED_BY)},
        "type": "Opaque",
        "immutable": True,
        "data": {CHECKPOINT_KEY_SECRET_DATA_KEY: base64.b64encode(key.encode()).decode()},
    }
