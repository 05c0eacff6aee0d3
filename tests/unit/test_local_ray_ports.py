"""Ports handed to Ray and SeaweedFS: picked free, distinct, and outside Ray's worker range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotray.contract.errors import SpotrayError
from spotray.local_ray import WORKER_PORTS, free_worker_port_range, node_port_flags
from spotray.train.storage.local_s3 import free_ports

pytestmark = pytest.mark.unit


def _ephemeral_range() -> range:
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def _ports(flags: list[str]) -> tuple[range, list[int]]:
    values = dict(re.fullmatch(r"--([a-z-]+)=(\d+)", flag).groups() for flag in flags)  # type: ignore[union-attr]
    workers = range(int(values.pop("min-worker-port")), int(values.pop("max-worker-port")) + 1)
    return workers, [int(port) for port in values.values()]


def test_many_ports_picked_at_once_are_distinct() -> None:
    # One at a time (bind, close, bind) the kernel handed one port out twice: SeaweedFS's master and
    # filer got the same one and the filer died.
    ports = free_ports(200)
    assert len(set(ports)) == 200


def test_ports_to_avoid_are_never_picked() -> None:
    ephemeral = _ephemeral_range()
    lower_half = range(ephemeral.start, ephemeral.start + len(ephemeral) // 2)  # about half the kernel's picks
    ports = free_ports(20, avoid=lower_half)
    assert not [port for port in ports if port in lower_half]


def test_no_named_ray_port_falls_in_the_worker_range_or_repeats() -> None:
    # CI once got a runtime-env-agent port inside the worker range, and `ray start` refused the node.
    for _ in range(50):
        workers, named = _ports(node_port_flags("127.0.0.2", free_worker_port_range("127.0.0.2"), taken=[5]))
        assert len(workers) == WORKER_PORTS
        assert not [port for port in named if port in workers]
        assert len(set(named)) == len(named)


def test_no_free_port_left_is_named_with_the_fix() -> None:
    with pytest.raises(SpotrayError, match="free ports") as raised:
        free_ports(3, avoid=range(65536))
    assert "loopback" in str(raised.value.fix)
