"""A job started while its S3 endpoint does not answer is an infrastructure fault, not bad input.

The issue: `AWS_ENDPOINT_URL=http://127.0.0.1:9 python -m spotray.jobs.gpt2 ...` retried 10 s,
printed "could not reach ..." and exited 2, the bad-input code, so the controller ended the whole
run at once (a MinIO pod restarting while an attempt started failed the run). The driver must exit
with the "infrastructure, try again" code instead (spotray/contract/attempts.py), which spends no
budget. No Ray and no S3 server: the endpoint is a closed loopback port, refused at once; the
driver gives up after its preflight retries (train/storage/store.py PREFLIGHT_RETRY, 10 s).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# The discard port: nothing listens there on a test machine, so a connection is refused at once.
CLOSED_ENDPOINT = "http://127.0.0.1:9"
INFRASTRUCTURE_EXIT = 75  # EX_TEMPFAIL; a literal so the test says what it expects of any version
BAD_INPUT_EXIT = 2


def unreachable_store_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "S3_", "SPOTRAY_"))}
    return {
        **env,
        "AWS_ENDPOINT_URL": CLOSED_ENDPOINT,
        # Credentials are there (their absence would be bad input, rightly); the server never answers.
        "AWS_ACCESS_KEY_ID": "spotray-test-key",
        "AWS_SECRET_ACCESS_KEY": "spotray-test-secret",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.parametrize("job", ["gpt2", "cnn"])
@pytest.mark.timeout(180)
def test_a_job_whose_store_does_not_answer_exits_as_an_infrastructure_fault(tmp_path: Path, job: str) -> None:
    command = [
        sys.executable,
        "-m",
        f"spotray.jobs.{job}",
        "--checkpoint-uri",
        "s3://bucket/x",
        "--data-uri",
        "s3://bucket/d",
        "--workdir",
        str(tmp_path / "work"),
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, env=unreachable_store_env(tmp_path), capture_output=True, text=True, timeout=150, check=False
    )
    took = time.monotonic() - started
    said = done.stdout[-2000:] + done.stderr[-2000:]
    assert "could not reach http://127.0.0.1:9" in done.stderr, said
    assert done.returncode != BAD_INPUT_EXIT, f"an unreachable store is not bad input: {said}"
    assert done.returncode == INFRASTRUCTURE_EXIT, said
    assert took < 120, f"gave up after {took:.0f} s"
