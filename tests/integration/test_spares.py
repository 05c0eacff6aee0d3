"""A fixed-size run with a spare worker pod goes on after a spot notice, at full size, in its attempt.

``spotray run --local --lose-worker-at 15 --worker-notice-s 30`` on a run of two workers with
``spareReplicas: 1``: local mode puts one worker on a Ray node of its own (127.0.0.3) and, once the
group trains, starts a spare node (127.0.0.4). The notice drains the worker's node; rank 0 reads
Ray's free room outside the draining nodes (the spare), so every rank saves at once and trains on;
the rank on the node tells the hook its checkpoint is safe, the node goes, and Ray Train restarts
the group at two workers, on the head and the spare, from the notice's checkpoint. No attempt ends,
no step is redone, and no budget is spent. Without a spare the same notice ends the attempt
(tests/integration/test_driver_notice.py and the chaos runs cover that path).
"""

import os
from pathlib import Path

import pytest

from bench.campaigns import chaos_runs
from bench.micro.spare_notice import notice_args, spares_manifest
from spotray.train.hf.data import trained_batches
from spotray.train.records.event_log import read_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_STEPS, GLOBAL_BATCH = 60, 8


@pytest.mark.campaign
def test_a_spot_notice_moves_a_fixed_size_run_onto_its_spare_in_the_same_attempt(tmp_path: Path) -> None:
    result = chaos_runs.run_local(
        tmp_path / "run",
        [],
        f"spares-{os.getpid()}",
        manifest_text=spares_manifest(MAX_STEPS, spares=1),
        timeout_s=900,
        extra_args=notice_args(notice_at=15, return_after="120s"),  # back after the run: it trains on the spare
    )
    assert result.exit_code == 0, result.log_tail()
    assert "spot notice to the worker node" in result.injected[0], result.injected
    assert (result.state["attempt"], result.state["preemptions"]) == (1, 0), "the spare kept the run in attempt 1"

    logged = list(read_events(result.workdir / "events.jsonl"))
    noticed = [e for e in logged if e["event"] == "preemption_notice"]
    assert [(e["going_on"], len(e["ranks"]), e["spare_room"] >= 1) for e in noticed] == [(True, 1, True)], noticed
    emergency = [e for e in logged if e["event"] == "emergency_checkpoint"]
    assert [e["going_on_without"] for e in emergency] == [noticed[0]["ranks"]], emergency
    started = [e for e in logged if e["event"] == "start"]
    assert [s["world_size"] for s in started] == [2, 2], "the group restarts at full size, on the spare"
    assert started[1]["resumed_from"] == emergency[0]["step"], "the restart skipped the notice's checkpoint"

    batches = trained_batches(result.workdir / "samples")
    assert sorted(batches) == list(range(1, MAX_STEPS + 1))
    every_id = [i for ids in batches.values() for i in ids]
    assert len(set(every_id)) == len(every_id) == MAX_STEPS * GLOBAL_BATCH, "a sample trained twice"
