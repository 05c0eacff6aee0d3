"""The handshake between a draining node's preStop hook and the training workers on that node.

An elastic run goes on without a node that gets a spot notice (train/hf/notice.py): every rank takes
an emergency checkpoint and the group keeps training until the node is gone; Ray Train then
restarts it smaller, from that checkpoint. The node must go as soon as the checkpoint is safe, not
at the end of the grace period, so the workers on it tell the hook (train/launch/drain.py) with a
file on the node: the hook and the workers share the pod's filesystem (local mode's nodes share one
machine, hence the node id in the name). Nothing else reads or trusts the file; only its existence
matters.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

_NODE_ID = re.compile(r"^[0-9a-f]{8,128}$")  # Ray's node ids are hex


def checkpointed_marker(node_id: str, directory: Path | None = None) -> Path:
    """Where the workers on ``node_id`` say that their emergency checkpoint is complete in the store."""
    if not _NODE_ID.match(node_id):
        raise ValueError(f"not a Ray node id: {node_id!r}")
    return (directory or Path(tempfile.gettempdir())) / f"spotray-drain-{node_id}.checkpointed"


def mark_checkpointed(node_id: str, directory: Path | None = None) -> None:
    checkpointed_marker(node_id, directory).touch()


def checkpointed(node_id: str, directory: Path | None = None) -> bool:
    return checkpointed_marker(node_id, directory).exists()
