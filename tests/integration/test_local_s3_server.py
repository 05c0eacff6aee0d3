"""The embedded SeaweedFS leaves nothing behind in the temp directory once stopped or killed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from spotray.train.storage.local_s3 import LocalS3Server

pytestmark = pytest.mark.integration


def sockets_of(server: LocalS3Server) -> list[Path]:
    ports = {server.port, *server._ports.values(), *server._grpc_ports.values()}
    return [path for port in ports for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock")]


def test_a_stopped_or_killed_server_leaves_no_socket_in_the_temp_directory(tmp_path: Path) -> None:
    server = LocalS3Server(tmp_path / "s3").start()
    try:
        assert sockets_of(server), "weed no longer makes unix sockets: this test and _remove_sockets can go"
        server.kill()
        assert sockets_of(server) == []
        server.start()  # the same ports again, as the outage tests restart it
        assert sockets_of(server)
    finally:
        server.stop()
    assert sockets_of(server) == []
