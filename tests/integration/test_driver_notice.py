"""The driver's own SIGTERM (a spot notice) ends its attempt within a bound, even when the emergency
checkpoint outlasts the drain deadline (nemesis trial 39 of seed 1).

Ray Train tears a worker group down once a preemption deadline passes and, by default, starts
another; with every node of the cluster drained by the driver, that group never started, and the
attempt showed "running" for 15 minutes (on that code this test's driver ran past its bound, its
stack in Ray Train's wait for the new group). Real Ray, a real S3 server (SeaweedFS).
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from spotray.contract.attempts import EXIT_PREEMPTED, AttemptId
from spotray.contract.spec import RunContext, parse_spec
from spotray.train.records.attempt_records import read_attempt_records
from spotray.train.storage.store import S3ObjectStore
from tests.conftest import start_in_own_group, wait_or_dump_stacks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.campaign]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("late_checkpoint_script.py")
GRACE_S = 4
CHECKPOINT_S = 9.0  # past the deadline, as trial 39's 13.3 s against 12.4 s


# A fixed-size group: Ray Train starts no other after the deadline, so fit() ends at once (the bound,
# far away here, never fires). An elastic group: Ray Train's restart waits for room on drained nodes,
# and the driver's bound ends the attempt. 50-70 s of real Ray each on 2 cores: make test-campaign,
# as make test runs over its 35 minutes; make test keeps the rules (tests/unit/test_driver_notice.py,
# test_launcher.py's preemption setting, test_job_fault_exits.py's outcome).
CASES = [
    pytest.param({"replicas": 1}, 600.0, "preempted before its emergency checkpoint was complete", id="fixed"),
    pytest.param(
        {"replicas": 2, "minReplicas": 1}, 5.0, "preempted before its emergency checkpoint was complete (fit() had "
        "not ended", id="elastic",
    ),
]  # fmt: skip


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("workers", "margin_s", "detail"), CASES)
def test_a_driver_sigterm_ends_the_attempt_when_the_checkpoint_outlasts_the_deadline(
    tmp_path: Path,
    s3_env: dict[str, str],
    s3_uri: str,
    s3_store: S3ObjectStore,
    workers: dict[str, object],
    margin_s: float,
    detail: str,
) -> None:
    spec = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())["spec"]
    spec["workers"] = {**workers, "cpu": "1", "memory": "1Gi", "gpu": 0}
    spec["checkpoint"] = {"uri": s3_uri}
    context = RunContext(name="late", run_id="local-late-checkpoint", attempt=1, spec=parse_spec(spec))
    ready = tmp_path / "ready"
    env = {**s3_env, **context.to_env(), "SPOTRAY_RAY_STORAGE": str(tmp_path / "ray-results")}
    env.pop("RAY_ADDRESS", None)  # the driver starts a Ray of its own, as local mode's does
    command = [sys.executable, str(SCRIPT), str(ready), str(CHECKPOINT_S), str(GRACE_S), str(margin_s)]
    log = (tmp_path / "driver.log").open("w")
    driver = start_in_own_group(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    bound = GRACE_S + CHECKPOINT_S + 90
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.5)
        driver.send_signal(signal.SIGTERM)
        noticed = time.monotonic()
        code = wait_or_dump_stacks(driver, timeout_s=bound)  # dumps every stack if it hangs
        waited = time.monotonic() - noticed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # and the Ray it started, whatever the driver left
        log.close()
    output = (tmp_path / "driver.log").read_text()
    assert code == EXIT_PREEMPTED, output[-4000:]
    assert waited < bound, waited
    # Ray Train tore the group down at the deadline, as the node itself would have gone then: the
    # checkpoint is cut, the attempt is a preemption, and the next one resumes from an older one.
    records = read_attempt_records(s3_store, AttemptId(context.run_id, 1))
    assert records.preempted is None, records
    assert records.exit_code == EXIT_PREEMPTED, records
    assert str(records.outcome and records.outcome["detail"]).startswith(detail), records
