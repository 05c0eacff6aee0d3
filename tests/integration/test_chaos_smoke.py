"""The chaos campaign's smoke (`make chaos` runs 200 trials): one trial of each kind against SeaweedFS."""

import random
from pathlib import Path

import pytest

from bench.campaigns.chaos import BUCKET, KINDS, MANIFEST_WINDOW
from spotray.train.storage.local_s3 import LocalS3Server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_trial_of_each_fault_keeps_every_invariant(
    kind: str, s3_server: LocalS3Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    s3_server.create_bucket(BUCKET)
    trial = KINDS[kind](s3_server.config, f"smoke-{request.node.name}", tmp_path, random.Random(7))
    assert trial.passed, trial.problem
    assert trial.steps_lost <= 10, "at most one checkpoint interval lost"
    assert trial.landed, "every trial says where its fault landed"
    if kind == "kill-before-manifest":
        assert MANIFEST_WINDOW in trial.landed, trial.landed
