"""Local mode keeps the Ray cluster an attempt left standing and usable (issue 39, item 5), on real Ray.

Attempt 1's driver exits 75 (an infrastructure fault: its store did not answer), which leaves the
cluster as it was; attempt 2 runs on that same cluster, and a Ray task there proves it usable. A
spot notice is the other case: the driver's SIGTERM drains every node, and the next attempt gets a
new cluster (tests/integration/test_attempt_contract.py and test_demo.py check that one).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.local_script_runs import run_driver_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import sys

    import ray

    from spotray.contract.spec import RunContext

    context = RunContext.from_env()
    if context.attempt == 1:
        sys.exit(75)  # an infrastructure fault: it spends no budget, and the cluster stays as it was
    ray.init()
    print("a task on the kept cluster returned", ray.get(ray.remote(lambda: 41 + 1).remote()))
    """
)


@pytest.mark.campaign
@pytest.mark.timeout(600)
def test_the_attempt_after_an_infrastructure_fault_runs_on_the_same_ray_cluster(tmp_path: Path) -> None:
    output, workdir, code = run_driver_script(tmp_path, "kept", DRIVER, timeout_s=500)
    assert code == 0, output[-4000:]
    assert "attempt 2 runs on the Ray cluster still standing" in output, output[-4000:]
    assert "a task on the kept cluster returned 42" in (workdir / "attempt-2.log").read_text()
    assert (workdir / "ray.log").read_text().count("Ray runtime started") == 1, "one `ray start` for both attempts"
