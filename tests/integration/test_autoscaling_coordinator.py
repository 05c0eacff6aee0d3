"""The driver asks for Ray Train's AutoscalingCoordinator as it connects (launcher.start_autoscaling_coordinator).

Real Ray: the detached actor Ray Train's controller looks for (its name and namespace) exists and
starts, and asking again is harmless. It is made by Ray's own function, which pins it to the caller's
node: the driver's, the head in a RayJob, never a spot worker it would die with. bench/micro/ray_train_start.py
measures what it saves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import json
    import ray
    from spotray.train.launch.launcher import start_autoscaling_coordinator

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    asked = [start_autoscaling_coordinator(), start_autoscaling_coordinator()]
    coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    ray.get(coordinator.__ray_ready__.remote(), timeout=180)
    print(json.dumps({"asked": asked, "started": True}))
    """
)


@pytest.mark.timeout(300)
def test_the_driver_starts_the_autoscaling_coordinator_ray_train_looks_for() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"asked": [True, True], "started": True}
