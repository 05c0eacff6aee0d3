"""Every call to an API server is bounded, against a peer that accepts the connection and never
answers (a hung proxy, a half-open link): the kind of silence a killed API server never gives,
since a closed port answers at once with a reset.

The peer is a real TCP listener on loopback that accepts and then reads forever (tests/conftest.py). The clients are
the real ones: the CLI's ClusterConnection (spotray/cli/cluster_client.py) and the controller's Cluster
(controller/kube.py), over the kubernetes client and urllib3.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import config

from spotray.cli.cluster_client import ClusterConnection
from spotray.cli.cluster_options import KubeOptions
from spotray.contract.errors import SpotrayError
from spotray.controller import kube as controller_kube

pytestmark = pytest.mark.integration


def kubeconfig_for(port: int, path: Path) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "silent", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u", "namespace": "ns"}}],
        "current-context": "silent",
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_clis_calls_end_with_the_fix_when_the_api_server_never_answers(silent_peer: int, tmp_path: Path) -> None:
    options = KubeOptions(kubeconfig=str(kubeconfig_for(silent_peer, tmp_path / "kubeconfig")))
    connection = ClusterConnection(options, request_timeout=(1.0, 1.0))
    started = time.monotonic()
    with pytest.raises(SpotrayError) as raised:
        connection.get_run("r")
    assert time.monotonic() - started < 15, "bounded by the read timeout (and urllib3's retries), not for ever"
    assert "could not reach the Kubernetes API" in str(raised.value)
    assert "timed out" in str(raised.value).lower()


def test_the_controllers_calls_end_when_the_api_server_never_answers(
    silent_peer: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_kube, "REQUEST_TIMEOUT", (1.0, 1.0))  # 30 s in production
    api = config.new_client_from_config(str(kubeconfig_for(silent_peer, tmp_path / "kubeconfig")))
    cluster = controller_kube.Cluster(api)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        cluster.get_run("ns", "r")
    assert time.monotonic() - started < 15, "bounded by the read timeout (and urllib3's retries)"
