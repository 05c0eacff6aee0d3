"""`spotray run --local` leaves no process behind, whatever stops it, and a stopped run resumes.

The command is stopped mid-training, once the S3 server, the Ray cluster (``ray start``, gcs_server,
raylet, the workers), the job driver and the upload process all exist: by SIGTERM (`kill`,
`timeout`), by SIGHUP (a closed terminal) and by SIGKILL of the command itself, which can run no
cleanup of its own. Every process of its tree, read from /proc before the signal, must be gone
soon after. SIGTERM and SIGHUP stop the run as Ctrl-C does, with an emergency checkpoint: it is
the newest complete checkpoint in the run's own S3 store, and (SIGHUP, in make test-campaign, as a
second run costs minutes) the same command started again in the same work directory resumes from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from spotray.contract.attempts import EXIT_INTERRUPTED
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.hf.streaming_memory import owns, registrations
from spotray.train.processes.subprocesses import is_running, start_time
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore
from tests.processes import process_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SAVE_STEPS = 10
RUN_URI = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())["spec"]["checkpoint"]["uri"]


def manifest(tmp_path: Path, max_steps: int) -> Path:
    document = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())
    document["metadata"]["name"] = "cleanup-test"
    document["spec"]["entrypoint"] = (
        f"python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size 8 --workdir {tmp_path}"
    )
    document["spec"]["checkpoint"]["everySteps"] = SAVE_STEPS
    path = tmp_path / f"trainingrun-{max_steps}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_command(path: Path, workdir: Path) -> list[str]:
    return [sys.executable, "-m", "spotray.cli", "run", str(path), "--local", "--workdir", str(workdir)]


def alive(tree: dict[int, tuple[int, str]]) -> list[str]:
    """Processes of ``tree`` still running (the same pid and start time, and not a zombie: a dead
    process whose new parent, pid 1 of a container, may never reap it)."""
    return [
        f"{pid} {command}" for pid, (started, command) in tree.items() if start_time(pid) == started and is_running(pid)
    ]


def wait_for_step(events: Path, step: int, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"local mode ended early with {process.returncode}"
        if events.exists() and any(e["event"] == "step" and e["step"] >= step for e in read_events(events)):
            return
        time.sleep(0.5)
    raise AssertionError(f"no step {step} within {timeout} s")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "signum",
    [
        # Each case starts a whole local run (S3 server, Ray cluster, job), 76 s and more, so all three
        # are in make test-campaign, and the chaos campaign stops `spotray run` with all three at
        # random steps (bench/campaigns/chaos_runs.py stop-cli-*). make test keeps what each relies on: the
        # one handler of SIGTERM and SIGHUP (tests/unit/test_cli_views.py) and, for SIGKILL, the
        # watchdog killing what its owner left, on real processes (tests/unit/test_reaper.py).
        pytest.param(signal.SIGTERM, marks=pytest.mark.campaign),
        pytest.param(signal.SIGKILL, marks=pytest.mark.campaign),
        pytest.param(signal.SIGHUP, marks=pytest.mark.campaign),
        # Ctrl-C (issue #69): the same emergency checkpoint, and the same command again resumes from it.
        pytest.param(signal.SIGINT, marks=pytest.mark.campaign),
    ],
    ids=["SIGTERM", "SIGKILL", "SIGHUP", "SIGINT"],
)
def test_a_stopped_local_run_leaves_no_process_behind(tmp_path: Path, signum: signal.Signals) -> None:
    workdir = tmp_path / "run"
    log = (tmp_path / "cli.log").open("wb")
    # A session of its own, as a terminal would give it: the signal goes to the command alone.
    cli = subprocess.Popen(
        run_command(manifest(tmp_path, 100_000), workdir), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for_step(workdir / "events.jsonl", SAVE_STEPS + 5, cli)
        tree = process_tree(cli.pid)
        commands = " ".join(command for _, command in tree.values())
        for part in (
            "weed",
            "ray start",
            "gcs_server",
            "raylet",
            "spotray.jobs.gpt2",
            "spotray.train.checkpoints.upload_worker",
        ):
            assert part in commands, f"{part} not running: {commands}"

        signalled = time.monotonic()
        os.kill(cli.pid, signum)
        cli.wait(timeout=180)
        print(f"{signum.name}: local mode ended {time.monotonic() - signalled:.1f} s after the signal")
        if signum != signal.SIGKILL:
            assert cli.returncode == EXIT_INTERRUPTED, (tmp_path / "cli.log").read_text()[-3000:]
        deadline = time.monotonic() + 60
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(tree) == [], "left behind"
        # ... and no shared memory: the dataset cache's streaming segments are released too.
        job_cache = tmp_path / "cleanup-test" / "mds-cache"
        assert [r.prefix for r in registrations() if any(owns(job_cache, d) for d in r.local_dirs)] == []
    finally:
        if cli.poll() is None:
            cli.kill()
        log.close()

    if signum == signal.SIGKILL:
        return
    # The stopped attempt is on record as interrupted, spending no budget (spotray/local/local_run.py).
    state = json.loads((workdir / "run-state.json").read_text())["status"]
    assert (state["attempts"][-1]["outcome"], state["attempts"][-1]["reason"]) == ("Suspended", "Interrupted")
    assert (state["preemptions"], state["failures"]) == (0, 0)
    notice = [e for e in read_events(workdir / "events.jsonl") if e["event"] == "emergency_checkpoint"]
    assert notice, "the run stops on an emergency checkpoint, as on Ctrl-C"
    step = notice[-1]["step"]
    with LocalS3Server(workdir / "s3") as server:  # local mode's own store, as a second run finds it
        store = S3ObjectStore(parse_uri(RUN_URI), server.config, RetryPolicy(deadline_s=30))
        latest = latest_complete_checkpoint(store)
        assert latest is not None
        assert latest.step == step
    if signum not in (signal.SIGHUP, signal.SIGINT):
        return
    before = len([e for e in read_events(workdir / "events.jsonl") if e["event"] == "start"])
    again = subprocess.run(
        run_command(manifest(tmp_path, step + 5), workdir), capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    starts = [e for e in read_events(workdir / "events.jsonl") if e["event"] == "start"]
    assert starts[before]["resumed_from"] == step, "the second run resumes from the emergency checkpoint"
