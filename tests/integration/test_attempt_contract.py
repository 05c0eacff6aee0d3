"""The attempt contract through real local runs: a finished run is not trained again, and a training
loop that keeps raising (issue 13) or whose worker keeps dying by a signal (issue 36) ends as a
failure instead of being retried for ever."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from spotray.train.records.event_log import read_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def manifest(tmp_path: Path, name: str, entrypoint: str, **spec: object) -> Path:
    document = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())
    document["metadata"]["name"] = name
    document["spec"]["entrypoint"] = entrypoint
    document["spec"].update(spec)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_local(path: Path, workdir: Path, *flags: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "spotray.cli", "run", str(path), "--local", "--workdir", str(workdir), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


# Two local runs, about 4 minutes: a campaign (make test-campaign). make test covers the same rule in
# parts: records read by identity (tests/unit/test_attempts.py) and outcome_after_fit by run id
# (test_ray_training), local mode's state file through the SIGTERM case of test_local_cleanup.
@pytest.mark.campaign
@pytest.mark.timeout(1200)
def test_a_finished_run_started_again_is_a_no_op_that_says_so(tmp_path: Path) -> None:
    """The issue's reproduction: a second run printed `steps 62/60` and counted
    the first run's preemption again."""
    entrypoint = f"python -m spotray.jobs.gpt2 --max-steps 60 --batch-size 8 --workdir {tmp_path}"
    path = manifest(tmp_path, "rerun", entrypoint, checkpoint={"uri": "s3://spotray-demo/runs/rerun", "everySteps": 10})
    workdir = tmp_path / "wd"

    first = run_local(path, workdir, "--preempt-at", "12")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "steps                60/60" in first.stdout
    assert "attempts             2 (1 preempted, 0 failed)" in first.stdout
    # The notice's SIGTERM drained every node of the cluster, which Ray never takes back: a new one.
    assert "attempt 2 runs on the Ray cluster still standing" not in first.stdout
    starts = len([e for e in read_events(workdir / "events.jsonl") if e["event"] == "start"])

    again = run_local(path, workdir)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "already complete" in again.stdout
    assert len([e for e in read_events(workdir / "events.jsonl") if e["event"] == "start"]) == starts, "trained again"


CRASHING_JOB = textwrap.dedent(
    """
    import os
    import signal
    import sys

    from spotray.train.launch.launcher import launch
    from spotray.contract.spec import RunContext
    from spotray.train.storage.store import open_store


    def raise_a_bug(config):
        raise ValueError("a deterministic bug in the training code")


    def die_by_sigkill(config):
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does


    def refuse_the_input(config):
        from spotray.contract.errors import UnloadableCheckpointError

        raise UnloadableCheckpointError("no checkpoint under the URI loads into this model", "use a new URI")


    train_loop = {"raise": raise_a_bug, "sigkill": die_by_sigkill, "bad-input": refuse_the_input}[sys.argv[1]]
    context = RunContext.from_env()
    sys.exit(launch(train_loop, {}, context, open_store(context.spec.checkpoint.uri)))
    """
)


def run_crashing_job(tmp_path: Path, name: str, how: str) -> subprocess.CompletedProcess[str]:
    """A one-worker local run whose training loop crashes ``how`` every time, with no failure to spare."""
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING_JOB)
    path = manifest(
        tmp_path,
        name,
        f"python {script} {how}",
        workers={"replicas": 1, "cpu": "1", "memory": "1Gi", "gpu": 0},
        checkpoint={"uri": f"s3://spotray-demo/runs/{name}"},
        retry={"maxFailures": 0, "maxPreemptions": 5, "backoffSeconds": 1},
    )
    return run_local(path, tmp_path / "wd", timeout=600)


# About 2.5 minutes of real Ray each: campaigns (make test-campaign), to keep make test within its
# budget once the real-pods e2e joined it. make test keeps the rule (tests/unit/test_crash_loop.py).
@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_a_training_loop_that_keeps_raising_fails_the_attempt_within_the_bound(tmp_path: Path) -> None:
    result = run_crashing_job(tmp_path, "buggy", "raise")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert "crashed 3 times with no new checkpoint" in output
    assert "ValueError: a deterministic bug in the training code" in output
    assert "1 failures exceed spec.retry.maxFailures=0" in output


@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_bad_input_fails_the_run_at_the_first_crash(tmp_path: Path) -> None:
    """A worker that meets bad input (here a checkpoint no model loads) fails the run with exit code 2
    after one crash: the worker group Ray Train starts next does not train (it took three)."""
    result = run_crashing_job(tmp_path, "refused", "bad-input")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    assert "gave up at the first crash" in output
    assert "no checkpoint under the URI loads into this model" in output
    assert "crashed 3 times" not in output


@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_a_worker_that_keeps_dying_by_sigkill_fails_the_attempt_within_the_bound(tmp_path: Path) -> None:
    """Issue 36: no exception to report, yet the same bound (a lost node still counts nothing)."""
    result = run_crashing_job(tmp_path, "sigkilled", "sigkill")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert "crashed 3 times with no new checkpoint" in output
    assert "died without raising an exception" in output
    assert "1 failures exceed spec.retry.maxFailures=0" in output
