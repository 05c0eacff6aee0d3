"""`python -m spotray.train.launch.drain`, the worker pods' preStop hook, against a real Ray node."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import GetTimeoutError, LocalRayletDiedError

from spotray.local.local_ray import LocalRayCluster

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=1)
def one() -> int:
    return 1


@ray.remote(num_cpus=0)
class RayTrainWorker:  # the class name Ray Train V2 gives its workers, which the hook waits for
    def ready(self) -> bool:
        return True


def start_hook(address: str, *args: str) -> subprocess.Popen[str]:
    """The preStop hook as the kubelet runs it, against the Ray cluster at ``address``, a 60 s deadline."""
    command = [sys.executable, "-m", "spotray.train.launch.drain", "--deadline-seconds", "60", *args]
    env = {**os.environ, "RAY_ADDRESS": address}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_prestop_hook_drains_its_ray_node_so_it_takes_no_new_work(tmp_path: Path) -> None:
    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log") as cluster:
        ray.init(address=cluster.address)
        try:
            assert ray.get(one.remote(), timeout=60) == 1  # the node works

            worker = RayTrainWorker.remote()  # type: ignore[attr-defined]
            assert ray.get(worker.ready.remote(), timeout=60)

            hook = start_hook(cluster.address)
            time.sleep(8)
            assert hook.poll() is None, "the hook must wait while a training worker is still on the node"
            started = time.monotonic()
            ray.kill(worker)  # the worker checkpointed and stopped
            output, _ = hook.communicate(timeout=30)

            assert hook.returncode == 0, output
            assert "accepted" in output, output
            assert "no training worker left on this node" in output, output
            assert time.monotonic() - started < 10, "the hook returns soon after the last worker leaves"
            # Drained as a preemption, the only node takes no new work: the task waits, or the raylet,
            # idle and drained, has already shut down.
            with pytest.raises((GetTimeoutError, LocalRayletDiedError)):
                ray.get(one.remote(), timeout=5)
        finally:
            ray.shutdown()


def test_the_heads_prestop_hook_drains_the_whole_cluster_and_waits_for_its_training_workers(tmp_path: Path) -> None:
    """A notice on the head's node (a spot head, a node drained for an upgrade) ends the whole Ray
    cluster: the head's hook drains every node as a preemption, so the workers, on other nodes, take
    their emergency checkpoint before the head and its GCS go."""
    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log") as cluster:
        ray.init(address=cluster.address)
        try:
            worker = RayTrainWorker.remote()  # type: ignore[attr-defined]
            assert ray.get(worker.ready.remote(), timeout=60)
            hook = start_hook(cluster.address, "--whole-cluster")
            time.sleep(8)
            assert hook.poll() is None, "the hook must wait while a training worker is alive in the cluster"
            started = time.monotonic()
            ray.kill(worker)
            output, _ = hook.communicate(timeout=30)

            assert hook.returncode == 0, output
            assert "drain of 1 of 1 nodes accepted" in output, output
            assert "no training worker left in the cluster" in output, output
            assert time.monotonic() - started < 10, "the hook returns soon after the last worker leaves"
        finally:
            ray.shutdown()
