"""Checkpoints of a run on several nodes, each with its own disk (worker pods have no shared one).

Each node's processes write their own files into the checkpoint on that node's disk: every rank its
RNG state, FSDP every rank its shard, ``save_on_each_node`` every node the whole model. A checkpoint
in the store must hold all of them. Two torchrun "nodes" run on this machine, each with its own
directories and one process, DDP over gloo; the store is a directory both can reach, as S3 is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotray.train.checkpoint import complete_checkpoints
from spotray.train.local_s3 import free_port
from spotray.train.store import LocalObjectStore, parse_uri
from tests.integration.test_async_checkpoint import assert_same

pytestmark = [pytest.mark.integration, pytest.mark.core]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("two_node_script.py")


def run_two_nodes(tmp_path: Path, store_root: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    nodes = []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(SCRIPT), str(tmp_path / f"node-{node}"), str(store_root),
        ]  # fmt: skip
        log = (tmp_path / f"node-{node}.log").open("w")
        nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
    try:
        codes = [process.wait(timeout=300) for process in nodes]
    finally:
        for process in nodes:
            process.kill()
    logs = "\n".join((tmp_path / f"node-{node}.log").read_text()[-3000:] for node in (0, 1))
    assert codes == [0, 0], logs


def test_a_run_on_two_nodes_with_their_own_disks_resumes_exactly_from_the_store(tmp_path: Path) -> None:
    store_root = tmp_path / "store"
    run_two_nodes(tmp_path, store_root)
    # Each node's disk held only its own rank's RNG state: the store's checkpoint must hold both.
    for node in (0, 1):
        local = tmp_path / f"node-{node}/shared-writer/checkpoints/checkpoint-3"
        assert sorted(p.name for p in local.glob("rng_state_*.pth")) == [f"rng_state_{node}.pth"]
    whole = load_file(store_root / "whole/checkpoint-6/model.safetensors")
    for name in ("shared-writer", "each-node"):
        store = LocalObjectStore(parse_uri(str(store_root / name)))
        assert [c.step for c in complete_checkpoints(store)] == [6, 3], name
        for info in complete_checkpoints(store):
            assert info.manifest is not None
            assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(info.manifest.files), name
        rank_1_rng = torch.load(store_root / name / "checkpoint-3/rng_state_1.pth", weights_only=False)
        local_rng = torch.load(tmp_path / f"node-1/{name}/checkpoints/checkpoint-3/rng_state_1.pth", weights_only=False)
        assert_same(local_rng, rank_1_rng, f"{name}: rank 1's RNG state")
        # Dropout draws from every rank's RNG: only with rank 1's state restored is the resume exact.
        assert_same(whole, load_file(store_root / name / "checkpoint-6/model.safetensors"), f"{name}: final weights")
