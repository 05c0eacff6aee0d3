"""Ports handed to Ray and SeaweedFS: picked free, distinct, and outside Ray's worker range."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from spotray.contract.errors import SpotrayError
from spotray.local import local_ray
from spotray.local.local_ray import WORKER_PORTS, free_worker_port_range, node_port_flags
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


def test_the_client_servers_port_is_free_on_127_0_0_1_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's client server binds 127.0.0.1 whatever the node's address. In CI the kernel handed a second
    local cluster, on 127.0.0.2, the port the first one's client server held on 127.0.0.1: the second's
    client server died after its head was up, and `ray start --block` took the head down with it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        real = local_ray.free_ports
        handed: list[int] = []

        def kernel(count: int, host: str, avoid: object = ()) -> list[int]:
            ports = real(count, host, avoid=avoid)  # type: ignore[arg-type]
            if not handed:  # the first pick: the port taken on 127.0.0.1, free on 127.0.0.2
                ports[-1] = taken
            handed.extend(ports)
            return ports

        monkeypatch.setattr(local_ray, "free_ports", kernel)
        names = [*local_ray.NODE_PORT_NAMES, "ray-client-server"]
        flags = node_port_flags("127.0.0.2", free_worker_port_range("127.0.0.2"), names)
        assert taken in handed, "the kernel's pick was the one taken on 127.0.0.1"
        assert f"--ray-client-server-port={taken}" not in flags, flags
        [client] = [flag for flag in flags if flag.startswith("--ray-client-server-port=")]
        port = int(client.split("=")[1])
        with socket.socket() as check:
            check.bind(("127.0.0.1", port))  # free there, where the client server binds
