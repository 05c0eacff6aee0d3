"""A spot notice shorter than the upload (issue 73, item 2): the emergency checkpoint is safe once the
nodes that stay hold it in their copies, and the next start completes it in the store.

On GKE a notice gives ordinary pods about 15 s; a multi-GB state at a bucket's 100-200 MB/s per node
takes longer to upload, and a node that waited for the store lost every step since the last periodic
checkpoint. When the run goes on without the noticed node (an elastic run, or one with a spare), its
group restarts on the nodes that stay, whose copies outlive it: the node may go as soon as the ring
has copied the checkpoint to them. Here two torchrun "nodes" with their own disks upload through a
link of 64 KB/s (the tiny model's checkpoint takes seconds, as a real one takes minutes); the notice
names node 1's rank at step 5 (notice_copies_script.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bench.campaigns.fault_proxy import FaultProxy
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import complete_checkpoints, download_checkpoint
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore
from tests.integration.test_async_checkpoint import assert_same
from tests.integration.test_multi_node_checkpoint import run_two_nodes

pytestmark = [pytest.mark.integration, pytest.mark.core]

SCRIPT = Path(__file__).with_name("notice_copies_script.py")
UPLOAD_BYTES_PER_S = 64 << 10


def test_a_notice_shorter_than_the_upload_loses_no_step_when_the_nodes_that_stay_hold_the_checkpoint(
    tmp_path: Path, s3_server: LocalS3Server, s3_store: S3ObjectStore, s3_env: dict[str, str]
) -> None:
    whole_uri, cut_uri = f"{s3_store.uri}/whole", f"{s3_store.uri}/notice"
    run_two_nodes(SCRIPT, tmp_path, s3_env, whole_uri, "whole", name="whole", label="whole")
    with FaultProxy(s3_server.port, upload_bytes_per_s=UPLOAD_BYTES_PER_S) as proxy:
        slow = s3_env | {"AWS_ENDPOINT_URL": proxy.endpoint_url, "S3_ENDPOINT_URL": proxy.endpoint_url}
        run_two_nodes(SCRIPT, tmp_path, slow, cut_uri, "notice", name="notice", label="notice")
    seen = json.loads((tmp_path / "notice/node-0/notice.json").read_text())
    [emergency] = seen["emergency"]
    assert (emergency["step"], emergency["going_on_without"]) == (5, [1]), emergency
    assert emergency.get("safe_in", "store") == "node copies", f"the notice waited for the store: {emergency}"
    assert not seen["in_store_when_safe"], "the upload was over before the copies: nothing tested"
    cut = S3ObjectStore(parse_uri(cut_uri), s3_server.config)
    assert [info.step for info in complete_checkpoints(cut)] == [3], "the emergency upload was not cut short"

    # Node 1 went with its disk; a new node takes its place. Both resume; node 0 holds all of checkpoint-5.
    gone = tmp_path / "notice/node-1"
    for path in sorted(gone.rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    run_two_nodes(SCRIPT, tmp_path, s3_env, cut_uri, "resume", name="notice", label="resume")
    resumed = json.loads((tmp_path / "notice/node-0/resume.json").read_text())
    assert resumed["step"] == 5, f"resumed from checkpoint-{resumed['step']}: the notice's steps were lost"
    assert resumed["read"]["completed_bytes"] > 0, resumed
    assert resumed["read"]["s3_bytes"] == 0, "node 0's copies hold the whole checkpoint"

    whole = S3ObjectStore(parse_uri(whole_uri), s3_server.config)
    ends = [
        load_file(download_checkpoint(store, info, tmp_path / "fetched" / label) / "model.safetensors")
        for label, store in (("whole", whole), ("notice", cut))
        for info in complete_checkpoints(store)
        if info.step == 12
    ]
    assert len(ends) == 2, "a run did not reach step 12"
    for key in ends[0]:
        assert_same(ends[0][key], ends[1][key], key)
