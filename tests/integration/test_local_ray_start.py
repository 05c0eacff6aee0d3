"""Starting local Ray nodes: a node that dies at start is started again with new ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray import local_ray
from spotray.local_ray import LocalRayCluster
from spotray.train.errors import SpotrayError

pytestmark = pytest.mark.integration

REAL_NODE_PORT_FLAGS = local_ray.node_port_flags


def _in_worker_range(host: str, worker_low: int) -> list[str]:
    """The port flags of the CI failure: the runtime-env agent's port inside the worker range."""
    flags = REAL_NODE_PORT_FLAGS(host, worker_low)
    return [
        f"--runtime-env-agent-port={worker_low + 33}" if flag.startswith("--runtime-env-agent-port=") else flag
        for flag in flags
    ]


def test_a_worker_node_refused_at_start_is_started_again_with_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fault (a port taken between our pick and Ray's check) cannot be had on demand from the
    # kernel, so the first pick is replaced by the one CI saw `ray start` refuse.
    picks = iter([_in_worker_range])

    def first_refused(host: str, worker_low: int) -> list[str]:
        return next(picks, REAL_NODE_PORT_FLAGS)(host, worker_low)

    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log") as cluster:
        monkeypatch.setattr(local_ray, "node_port_flags", first_refused)
        node = cluster.add_worker_node(1)
        logs = [path.read_text() for path in cluster.temp_dir.glob("ray-node-*.log")]
        assert node._process is not None
        assert node._process.poll() is None, "the second start is up"
        assert len(logs) == 2
        assert [log for log in logs if "used by other components" in log], "the first start was not refused"


def test_a_worker_node_refused_every_time_says_so_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log") as cluster:
        monkeypatch.setattr(local_ray, "node_port_flags", _in_worker_range)
        with pytest.raises(SpotrayError, match="exited during startup") as raised:
            cluster.add_worker_node(1)
        assert f"{local_ray.STARTUP_ATTEMPTS} times" in raised.value.problem
        assert "used by other components" in raised.value.problem
