"""A smoke of the nemesis campaign (bench/nemesis.py, `make nemesis`) in make test: two trials with
fixed faults that land in different windows, judged by the campaign's own history checker.

- trial 1: S3 silent as attempt 1 starts (the controller's and the job's first reads), then the
  spot node lost right after a checkpoint save (its upload in flight): one preemption, nothing else;
- trial 2: the controller SIGKILLed mid-training, then the attempt's RayJob deleted: nothing spent,
  attempt 2 resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.nemesis import Campaign, Fault, print_result, run_trial
from spotray.train.storage.local_s3 import LocalS3Server
from tests.e2e.conftest import tb

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = [
    (1, [Fault("s3-silent", "start", 2.0), Fault("node-lost", "upload", 10)]),
    (2, [Fault("controller-kill", "step", 5), Fault("rayjob-deleted", "step", 15)]),
]


def test_a_few_nemesis_trials_keep_every_promise(testbed: tb.Testbed, s3_server: LocalS3Server, tmp_path: Path) -> None:
    namespace = f"nemesis-smoke-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", namespace)
    try:
        with Campaign(testbed, s3_server, namespace, tmp_path).running() as campaign:
            results = [run_trial(campaign, number, 1000 + number, faults) for number, faults in SMOKE]
    finally:
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    for result in results:
        print_result(result)
    for result in results:
        assert [land.kind for land in result.landings if not land.missed] == [f.kind for f in result.faults], (
            "every planned fault landed"
        )
        assert result.problems == [], f"trial {result.number}: {result.problems}; logs in {result.kept}"
    assert results[0].attempts[0].endswith("Preempted/NodeLost")
    assert results[1].attempts[0].endswith("Interrupted/RayJobGone") or "SpotNotice" in results[1].attempts[0]
