"""Local mode notices a Ray head that dies under a running attempt (found by CI: a wait without bound).

`ray start --block` takes the whole head down when one of its processes dies (in CI it was Ray's
client server, whose port another cluster held). The driver then waits for the gone GCS: Ray gives a
driver no deadline for that. Local mode must end such an attempt as a lost node (an infrastructure
fault, counted as a preemption, never a failure) and run the next one on a new cluster.

Here attempt 1's driver kills its head's GCS server itself, then sleeps as a driver stuck on the
gone GCS would; attempt 2 runs a Ray task on the new cluster. Real Ray, real `ray start`.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.local_script_runs import run_driver_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import os
    import signal
    import time
    from pathlib import Path

    import ray

    from spotray.contract.spec import RunContext

    context = RunContext.from_env()
    ray.init()
    if context.attempt == 1:
        port = os.environ["RAY_ADDRESS"].rsplit(":", 1)[1]
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().split(b"\\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"gcs_server") and f"--gcs_server_port={port}".encode() in argv:
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
                print("killed my head's GCS server", flush=True)
        while True:  # what a driver waiting on a gone GCS does: nothing, without end
            time.sleep(1)
    print("a task on the new cluster returned", ray.get(ray.remote(lambda: 41 + 1).remote()))
    """
)


@pytest.mark.timeout(600)
def test_a_head_that_dies_under_an_attempt_ends_it_as_a_lost_node(tmp_path: Path) -> None:
    began = time.monotonic()
    try:
        output, workdir, code = run_driver_script(tmp_path, "headless", DRIVER, timeout_s=400)
    except subprocess.TimeoutExpired as stuck:
        pytest.fail(f"local mode still waited on a dead head after 400 s: {stuck.stdout!r}"[-3000:])
    assert code == 0, output[-4000:]
    assert "killed my head's GCS server" in (workdir / "attempt-1.log").read_text()
    assert "a task on the new cluster returned 42" in (workdir / "attempt-2.log").read_text()
    status = json.loads((workdir / "run-state.json").read_text())["status"]
    assert status["preemptions"] == 1, status
    assert status["failures"] == 0, status
    assert "Ray head" in output, output[-4000:]
    # Ray's own GCS reconnect wait is 60 s: the watch must not be the thing that waits longer.
    assert time.monotonic() - began < 300, output[-4000:]
