"""The driver's SIGTERM on a Ray cluster that outlives its attempt leaves the cluster usable.

On a run's kept cluster (controller.rayClusterPerRun) or the chart's long-lived one, a driver gets
SIGTERM when its job is stopped: its RayJob deleted (KubeRay's finalizer stops the Ray job), a run
suspended, `ray job stop`. Its nodes stay, for the run's next attempt or for other runs. The driver
of an attempt on a cluster of its own drains every node on SIGTERM (a spot notice for the whole
cluster, train/launch/driver_notice.py), and Ray never schedules on a drained node again: on a kept
cluster that left every later attempt unschedulable. Real Ray: one `ray start --head`, the drivers
as processes connected to it, each installing the SIGTERM handling as ``launch`` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spotray.local.local_ray import LocalRayCluster
from tests.conftest import start_in_own_group, wait_or_dump_stacks

# About 90 s of real Ray on 2 cores: make test-campaign; make test keeps the rules as unit tests
# (tests/unit/test_driver_notice.py, test_ray_cluster_per_run.py).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.campaign]

REPO = Path(__file__).resolve().parents[2]

# A driver that connects, installs the driver's SIGTERM handling as launch() does, says it is ready,
# and then waits; its exit code tells the test how the SIGTERM ended it.
DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import ray

    from spotray.contract.spec import RunContext, parse_spec
    from spotray.train.launch.launcher import install_driver_sigterm

    outlives = sys.argv[2] == "outlives"
    spec = parse_spec({"entrypoint": "x", "checkpoint": {"uri": "s3://bucket/runs/kept"}})
    context = RunContext("kept", "local-kept", 1, spec, ray_cluster_outlives_attempt=outlives)
    ray.init(address="auto")
    notice = install_driver_sigterm(context, store=None, grace_seconds=30, notice_margin_s=600)
    Path(sys.argv[1]).write_text("ready")
    while not notice.received:
        time.sleep(0.2)
    time.sleep(3)  # the drain is done by now; Ray's job supervisor would SIGKILL here (3 s)
    sys.exit(143)
    """
)

# Another driver, later (the next attempt's): a task that needs the CPU of the cluster's only node.
SCHEDULE = textwrap.dedent(
    """
    import sys

    import ray

    try:
        ray.init(address="auto")
        print("task returned", ray.get(ray.remote(num_cpus=1)(lambda: 41 + 1).remote(), timeout=float(sys.argv[1])))
    except (ConnectionError, ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as error:
        # A drained node takes no driver (Ray finds no node to connect to) and no task.
        print("task never ran:", type(error).__name__, error)
    """
)


def stop_driver(tmp_path: Path, env: dict[str, str], which: str) -> int:
    """Start a driver, SIGTERM it once it is ready; its exit code."""
    ready = tmp_path / f"ready-{which}"
    log = (tmp_path / f"driver-{which}.log").open("w")
    command = [sys.executable, "-c", DRIVER, str(ready), which]
    driver = start_in_own_group(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert driver.poll() is None, (tmp_path / f"driver-{which}.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the driver never connected"
            time.sleep(0.2)
        driver.send_signal(signal.SIGTERM)
        return wait_or_dump_stacks(driver, timeout_s=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        log.close()


def schedule(env: dict[str, str], timeout_s: float) -> str:
    command = [sys.executable, "-c", SCHEDULE, str(timeout_s)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.timeout(400)
def test_a_driver_stopped_on_a_cluster_that_outlives_it_drains_no_node(tmp_path: Path) -> None:
    with LocalRayCluster(num_cpus=1) as cluster:  # its own short /tmp dir: Ray's sockets allow 107 bytes
        env = {**cluster.ray_env(), "PYTHONPATH": str(REPO)}
        code = stop_driver(tmp_path, env, "outlives")
        output = (tmp_path / "driver-outlives.log").read_text()
        assert code == -signal.SIGTERM, output[-4000:]  # ended as the signal ends a process
        assert "drains no node" in output, output[-4000:]
        after = schedule(env, timeout_s=60)
        assert "task returned 42" in after, after[-4000:]
        # The same SIGTERM to a driver of an attempt with a cluster of its own drains every node, and
        # the cluster takes no task again: what a kept cluster got before, on every stopped job.
        code = stop_driver(tmp_path, env, "own")
        assert code == 143, (tmp_path / "driver-own.log").read_text()[-4000:]
        after = schedule(env, timeout_s=10)
        assert "task never ran" in after, after[-4000:]
