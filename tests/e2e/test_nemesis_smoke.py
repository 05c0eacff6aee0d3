"""A smoke of the nemesis campaign (bench/campaigns/nemesis.py, `make nemesis`) in make test: one trial with
two fixed faults in two windows, judged by the campaign's own history checker.

- attempt 1's RayJob deleted at step 14: judged from what it left (no record: Interrupted, nothing
  spent), and attempt 2 (never 1 again) resumes from checkpoint-10 (or the emergency one);
- the API server SIGKILLed 2 s into attempt 2's start-up, back a few seconds later: nothing is
  lost or added, and attempt 2 finishes.

In this order each fault has its moment whatever the machine's load: the other way round, a slow
restart of the API server let attempt 1 train to its end before its RayJob could be deleted.

The e2e tests of the same two faults alone (tests/e2e/test_controller.py: the deleted RayJob, the
API server lost mid-attempt) moved to make test-campaign: this covers them in about the same time.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.campaigns.nemesis import Campaign, Fault, Pace, print_result, run_trial
from spotray.train.storage.local_s3 import LocalS3Server
from tests.e2e.conftest import tb

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = [Fault("rayjob-deleted", "step", 14), Fault("apiserver-kill", "start", 2.0)]
# Shorter than the campaign's pace: these two faults are short, and a smoke's minutes count in make test.
SMOKE_PACE = Pace(steps=30, every=10, step_seconds=0.3)


def test_a_nemesis_trial_keeps_every_promise(testbed: tb.Testbed, s3_server: LocalS3Server, tmp_path: Path) -> None:
    namespace = f"nemesis-smoke-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", namespace)
    try:
        # One head started before the run, the second while attempt 1 starts: both up front held the
        # trial back by a head's start (21 s of the 53 s the two took one after the other).
        campaign = Campaign(testbed, s3_server, namespace, tmp_path, warm_heads=1, heads_needed=2, pace=SMOKE_PACE)
        with campaign.running():
            result = run_trial(campaign, 1, 1001, SMOKE)
            # The checker's count of creations reads the audit log: it must see them to catch a second one.
            created = campaign.rayjob_creations("t1")
    finally:
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    print_result(result)
    assert [land.kind for land in result.landings if not land.missed] == [f.kind for f in SMOKE], "all landed"
    assert result.problems == [], f"{result.problems}; logs in {result.kept}"
    # Deleting a RayJob stops its Ray job: a driver quick enough for its emergency checkpoint records a notice.
    assert result.attempts[0] in ("1 Interrupted/RayJobGone", "1 Preempted/SpotNotice")
    assert result.attempts[1:] == ["2 Succeeded/TrainingFinished"]
    assert created == {"t1-a1": 1, "t1-a2": 1}
