"""A run whose S3 store hangs for 5 minutes as its first attempt starts ends Succeeded, spending nothing (issue 36).

The store is a SeaweedFS of the test's own, paused (SIGSTOP) before `spotray run --local` starts and
let go (SIGCONT) ``OUTAGE_S`` later. A paused server is harder on a client than one that is gone: its
port accepts connections and nothing ever answers, so only the clients' own timeouts end a call.
What has to happen, and about when:

- attempt 1: the local Ray cluster starts, then the driver's preflight check of the bucket times out
  (train/storage/store.py ``PREFLIGHT_READ_TIMEOUT_S``: about 20 s) and the driver exits 75, an
  infrastructure fault;
- local mode reads the attempt's records, which the store gives once it answers again (reads are
  retried for 10 minutes); the attempt ends Interrupted (InfrastructureFault), no budget is spent, and
  local mode says what it waits for, in the driver's words, then waits the backoff
  (max(spec.retry.backoffSeconds, 15 s): 30 s here);
- attempt 2 trains every step from scratch (attempt 1 saved nothing) and the run ends Succeeded.

About 8 minutes in all on two busy cores.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from spotray.contract.uris import parse_uri
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from tests.integration.test_demo import short_manifest

pytestmark = pytest.mark.integration

OUTAGE_S = 300.0
MAX_STEPS = 30  # checkpoints every 10 (short_manifest)


def store_env(server: LocalS3Server, tmp_path: Path) -> dict[str, str]:
    """This process's environment with the test's server as the only S3 there is."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "S3_", "SPOTRAY_"))}
    return {
        **env,
        **server.env(),
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.campaign
@pytest.mark.timeout(1500)
def test_a_run_whose_store_hangs_for_5_minutes_as_it_starts_succeeds_with_no_failure_spent(tmp_path: Path) -> None:
    manifest = short_manifest(tmp_path, max_steps=MAX_STEPS)
    spec = yaml.safe_load(manifest.read_text())["spec"]
    workdir = tmp_path / "run"
    server = LocalS3Server(tmp_path / "s3").start()
    resumed_at: list[float] = []

    def end_outage() -> None:
        server.resume()
        resumed_at.append(time.monotonic())

    outage = threading.Timer(OUTAGE_S, end_outage)
    try:
        for uri in {spec["checkpoint"]["uri"], spec["data"]["uri"]}:
            server.create_bucket(parse_uri(uri).bucket)
        server.pause()
        started = time.monotonic()
        outage.start()
        command = [sys.executable, "-m", "spotray.cli", "run", str(manifest), "--local", "--workdir", str(workdir)]
        result = subprocess.run(
            command, env=store_env(server, tmp_path), capture_output=True, text=True, timeout=1400, check=False
        )
        took = time.monotonic() - started
    finally:
        outage.cancel()
        server.stop()  # resumes it first when the timer has not
    output = result.stdout + result.stderr
    print(f"spotray run took {took:.0f} s; the store answered again after {OUTAGE_S:.0f} s\n{output[-6000:]}")
    assert resumed_at, f"the run ended before the outage did, after {took:.0f} s:\n{output[-5000:]}"
    assert result.returncode == 0, output[-5000:]

    status = json.loads((workdir / "run-state.json").read_text())["status"]
    assert status["phase"] == "Succeeded", status
    assert status["failures"] == 0, status
    assert status["preemptions"] == 0, status
    attempts = status["attempts"]
    interrupted = [a for a in attempts if a["outcome"] == "Interrupted"]
    assert interrupted, attempts
    assert all(a["reason"] == "InfrastructureFault" for a in interrupted), attempts
    assert attempts[-1]["outcome"] == "Succeeded", attempts
    assert "0 failed" in output

    # The driver gave up on the hung store by its own timeouts, as an infrastructure fault.
    first_log = (workdir / "attempt-1.log").read_text(errors="replace")
    assert f"could not reach {server.endpoint_url}" in first_log, first_log[-3000:]
    # What the run waited for, and that it spent nothing on it, in the words it printed.
    assert "waiting for the infrastructure" in output, output[-5000:]
    assert "which spend no budget" in output, output[-5000:]
    assert f"could not reach {server.endpoint_url}" in output, output[-5000:]

    events = list(read_events(workdir / "events.jsonl"))
    ends = [e for e in events if e["event"] == "end"]
    assert ends, output[-3000:]
    assert ends[-1]["step"] == MAX_STEPS
    final_config = json.loads((workdir / "final" / f"checkpoint-{MAX_STEPS}" / "config.json").read_text())
    assert final_config["model_type"] == "gpt2"
