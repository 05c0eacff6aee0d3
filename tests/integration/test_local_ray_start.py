"""Starting local Ray nodes: a node that dies at start is started again with new ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotray.contract.errors import SpotrayError
from spotray.local import local_ray
from spotray.local.local_ray import LocalRayCluster

pytestmark = pytest.mark.integration

REAL_NODE_PORT_FLAGS = local_ray.node_port_flags
PortFlags = Callable[[str, int], list[str]]


def _in_worker_range(host: str, worker_low: int) -> list[str]:
    """The port flags of the CI failure: the runtime-env agent's port inside the worker range."""
    return [
        f"--runtime-env-agent-port={worker_low + 33}" if flag.startswith("--runtime-env-agent-port=") else flag
        for flag in REAL_NODE_PORT_FLAGS(host, worker_low)
    ]


def test_a_worker_node_refused_at_start_is_started_again_and_one_refused_every_time_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fault (a port taken between our pick and Ray's check) cannot be had on demand from the
    # kernel, so picks are replaced by the one CI saw `ray start` refuse. One head serves both cases.
    picks: Iterator[PortFlags] = iter([])

    def next_pick(host: str, worker_low: int) -> list[str]:
        return next(picks, REAL_NODE_PORT_FLAGS)(host, worker_low)

    with LocalRayCluster(num_cpus=1, log_path=tmp_path / "ray.log") as cluster:
        monkeypatch.setattr(local_ray, "node_port_flags", next_pick)  # the head started with real picks
        picks = iter([_in_worker_range] * local_ray.STARTUP_ATTEMPTS)
        with pytest.raises(SpotrayError, match="exited during startup") as raised:
            cluster.add_worker_node(1, host="127.0.0.4")
        assert f"{local_ray.STARTUP_ATTEMPTS} times" in raised.value.problem
        assert "used by other components" in raised.value.problem  # Ray's own words, for whoever reads it

        picks = iter([_in_worker_range])
        node = cluster.add_worker_node(1)
        assert node._process is not None
        assert node._process.poll() is None, "the second start is up"
        refused = [
            path for path in cluster.temp_dir.glob("ray-node-127.0.0.3-*.log") if "used by other" in path.read_text()
        ]
        assert len(refused) == 1, "the first start of the node was not the refused one"
