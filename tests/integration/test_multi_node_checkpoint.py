"""Checkpoints of a run on several nodes, each with its own disk (worker pods have no shared one).

Each node's processes write their own files into the checkpoint on that node's disk: every rank its
RNG state, FSDP every rank its shard, ``save_on_each_node`` every node the whole model. A checkpoint
in the store must hold all of them (train/checkpoints/node_parts.py). Two torchrun "nodes" run on this machine,
each with its own directories and one process, DDP over gloo, checkpoints in SeaweedFS; the
Trainer's own save, ``save_on_each_node`` and async saves (two_node_script.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import complete_checkpoints, download_checkpoint
from spotray.train.storage.local_s3 import free_port
from spotray.train.storage.store import S3ObjectStore
from tests.conftest import start_in_own_group, torchrun_env, wait_or_dump_stacks
from tests.integration.test_async_checkpoint import assert_same

pytestmark = [pytest.mark.integration, pytest.mark.core]

SCRIPT = Path(__file__).with_name("two_node_script.py")


def run_two_nodes(
    script: Path, tmp_path: Path, env: dict[str, str], *args: str, name: str = "", label: str = "run"
) -> None:
    """``script`` on two torchrun "nodes" of one process each, node k's first argument its own directory
    (``tmp_path/name/node-k``) and then ``args``; both must exit 0 (their logs beside, ``label-node-k.log``)."""
    port = free_port()
    env = torchrun_env(env)
    nodes, logs = [], [tmp_path / f"{label}-node-{node}.log" for node in (0, 1)]
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(script), str(tmp_path / name / f"node-{node}"), *args,
        ]  # fmt: skip
        with logs[node].open("w") as log:
            nodes.append(start_in_own_group(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
    deadline = time.monotonic() + 300
    codes = [wait_or_dump_stacks(process, max(1.0, deadline - time.monotonic())) for process in nodes]
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)


def test_a_run_on_two_nodes_with_their_own_disks_resumes_exactly_from_the_store(
    tmp_path: Path, s3_store: S3ObjectStore, s3_env: dict[str, str]
) -> None:
    run_two_nodes(SCRIPT, tmp_path, s3_env, str(s3_store.uri))
    # Each node's disk held only its own rank's RNG state: the store's checkpoint must hold both.
    for node in (0, 1):
        local = tmp_path / f"node-{node}/shared-writer/checkpoints/checkpoint-3"
        assert sorted(p.name for p in local.glob("rng_state_*.pth")) == [f"rng_state_{node}.pth"]

    def fetched(name: str, step: int) -> Path:
        store = S3ObjectStore(parse_uri(f"{s3_store.uri}/{name}"), s3_store.config, s3_store.retry)
        [info] = [c for c in complete_checkpoints(store) if c.step == step]
        return download_checkpoint(store, info, tmp_path / "fetched" / name)  # every checksum verified

    whole = load_file(fetched("whole", 6) / "model.safetensors")
    for name in ("shared-writer", "each-node", "async", "kept", "kept-node-lost", "kept-upload-lost"):
        cut = fetched(name, 3)
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= {
            p.name for p in cut.iterdir()
        }, name
        local_rng = torch.load(tmp_path / f"node-1/{name}/checkpoints/checkpoint-3/rng_state_1.pth", weights_only=False)
        assert_same(local_rng, torch.load(cut / "rng_state_1.pth", weights_only=False), f"{name}: rank 1's RNG state")
        # Dropout draws from every rank's RNG: only with rank 1's state restored is the resume exact.
        assert_same(whole, load_file(fetched(name, 6) / "model.safetensors"), f"{name}: final weights")
