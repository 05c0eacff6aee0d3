"""`spotray logs` through the API server (issue #72, item 4): the attempt's submitter pod's log, no
port-forward and no token; `-f` follows it as it comes, attempt after attempt, until the run ends.

The fake stands for ClusterConnection's calls; the real ones (pods/log of a real submitter pod through
a real API server and kubelet) are tests/e2e/test_real_pods.py's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml

from spotray.cli.cluster_client import ClusterConnection
from spotray.cli.cluster_options import KubeOptions
from spotray.cli.exit_codes import CommandFailedError, NotFoundError
from spotray.cli.logs import SUBMITTER_CONTAINER, logs_command
from spotray.contract.errors import SpotrayError

pytestmark = pytest.mark.unit


def run(attempt: int, phase: str = "Running", ended: tuple[int, ...] = ()) -> dict[str, Any]:
    attempts = [
        {"attempt": n, "rayJob": f"r-a{n}", "outcome": "Preempted" if n in ended else "Running"}
        | ({"reason": "SpotNotice", "endTime": "2026-12-03T10:00:00Z"} if n in ended else {})
        for n in range(1, attempt + 1)
    ]
    return {"metadata": {"name": "r"}, "status": {"phase": phase, "attempt": attempt, "attempts": attempts}}


class Cluster:
    """A run whose status moves on at each read (``runs``, the last one repeated); submitter pods by RayJob,
    each with its log chunks, and how many reads of it say its container has not started yet."""

    namespace = "team"

    def __init__(self, runs: list[dict[str, Any]], logs: dict[str, list[str]], waiting: int = 0) -> None:
        self.runs, self.logs, self.waiting = runs, logs, waiting
        self.reads: list[tuple[str, bool]] = []

    def get_run(self, name: str) -> dict[str, Any]:
        return self.runs.pop(0) if len(self.runs) > 1 else self.runs[0]

    def get_ray_job(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"jobId": "raysubmit_1", "dashboardURL": "127.0.0.1:1"}}

    def submitter_pod(self, ray_job: str) -> dict[str, Any] | None:
        return {"metadata": {"name": f"{ray_job}-sub"}} if ray_job in self.logs else None

    def pod_log(self, pod: str, container: str, *, follow: bool) -> Iterator[str]:
        assert container == SUBMITTER_CONTAINER
        self.reads.append((pod, follow))
        if self.waiting:
            self.waiting -= 1
            raise NotFoundError(f"pod team/{pod} has not started yet", "follow it: -f")
        yield from self.logs[pod.removesuffix("-sub")]


def test_logs_come_from_the_submitter_pod_through_the_api_server(capsys: Any) -> None:
    cluster = Cluster([run(2)], {"r-a2": ["submitted\n", "step 1\n"]})
    assert logs_command(cluster, "r", None, None) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out == "submitted\nstep 1\n"
    assert cluster.reads == [("r-a2-sub", False)]


def test_without_a_submitter_pod_the_dashboard_is_asked_and_its_error_says_how_to_reach_it() -> None:
    # HTTPMode: KubeRay's operator submits, no pod holds the log; the head's dashboard is in the cluster.
    with pytest.raises(CommandFailedError) as caught:
        logs_command(Cluster([run(1)], {}), "r", None, None)  # type: ignore[arg-type]
    assert "kubectl port-forward -n team svc/" in str(caught.value)


def test_follow_goes_from_attempt_to_attempt_until_the_run_ends(capsys: Any) -> None:
    runs = [run(1), run(1), run(2, ended=(1,)), run(2, ended=(1,)), run(2, "Succeeded", ended=(1,))]
    cluster = Cluster(runs, {"r-a1": ["one\n"], "r-a2": ["two\n", "done\n"]}, waiting=1)
    naps: list[float] = []
    assert logs_command(cluster, "r", None, None, follow=True, sleep=naps.append) == 0  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert out == "one\ntwo\ndone\n"
    assert "attempt 1 ended Preempted (SpotNotice)" in err
    assert "following attempt 2 of team/r" in err
    # attempt 1's pod had not started at the first read: waited for, then followed to its end, once.
    assert cluster.reads == [("r-a1-sub", True), ("r-a1-sub", True), ("r-a2-sub", True)]
    assert naps, "it waited between reads"


def test_follow_of_one_attempt_returns_when_that_attempt_ended(capsys: Any) -> None:
    cluster = Cluster([run(1), run(2, ended=(1,))], {"r-a1": ["one\n"], "r-a2": ["two\n"]})
    assert logs_command(cluster, "r", 1, None, follow=True, sleep=lambda _s: None) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out == "one\n"
    assert [pod for pod, _ in cluster.reads] == ["r-a1-sub"]


def test_follow_waits_for_a_run_that_has_not_started_an_attempt(capsys: Any) -> None:
    cluster = Cluster([run(0), run(0), run(1, "Succeeded")], {"r-a1": ["one\n"]})
    assert logs_command(cluster, "r", None, None, follow=True, sleep=lambda _s: None) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out == "one\n"


def test_follow_of_an_http_mode_attempt_says_there_is_no_pod_to_follow() -> None:
    class HttpMode(Cluster):
        def get_ray_job(self, name: str) -> dict[str, Any]:
            return {**super().get_ray_job(name), "spec": {"submissionMode": "HTTPMode"}}

    with pytest.raises(SpotrayError, match="submits its job over HTTP") as caught:
        logs_command(HttpMode([run(1)], {}), "r", None, None, follow=True, sleep=lambda _s: None)  # type: ignore[arg-type]
    assert "--dashboard URL" in str(caught.value)


def test_follow_asks_no_dashboard() -> None:
    with pytest.raises(SpotrayError, match="drop --dashboard"):
        logs_command(Cluster([run(1)], {}), "r", None, "http://localhost:8265", follow=True)  # type: ignore[arg-type]


class ApiServer(BaseHTTPRequestHandler):
    """Stands in for the API server's pods and pods/log endpoints, on loopback: the kubernetes client
    (its request building and argument validation) is the real one. A followed log is sent in two
    chunks with a pause between them, as a live container's comes."""

    def do_GET(self) -> None:
        path, _, raw_query = self.path.partition("?")
        query = {key: values[0] for key, values in parse_qs(raw_query).items()}
        if path == "/api/v1/namespaces/team/pods":
            assert query["labelSelector"] == "batch.kubernetes.io/job-name=r-a2", query
            pods = [
                {"metadata": {"name": name, "namespace": "team", "creationTimestamp": created}}
                for name, created in (("r-a2-old", "2026-12-03T10:00:00Z"), ("r-a2-new", "2026-12-03T10:05:00Z"))
            ]
            self._send(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": pods}).encode())
        elif path == "/api/v1/namespaces/team/pods/r-a2-new/log":
            assert query["container"] == SUBMITTER_CONTAINER, query
            chunks = [b"submitted\n", b"step 1\n"] if query.get("follow") == "true" else [b"submitted\nstep 1\n"]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/api/v1/namespaces/team/pods/r-a3-new/log":
            message = 'container "ray-job-submitter" in pod "r-a3-new" is waiting to start: ContainerCreating'
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": 400}
            self._send(json.dumps(body).encode(), 400)
        else:
            self._send(b"{}", 404)

    def _send(self, body: bytes, code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_real_client_reads_and_follows_a_pod_log_through_the_api(tmp_path: Path) -> None:
    # Found on real pods: the client refuses a (connect, None) timeout; a followed read has none.
    server = ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
                "current-context": "x",
            }
        )
    )
    try:
        cluster = ClusterConnection(KubeOptions(kubeconfig=str(kubeconfig)))
        pod = cluster.submitter_pod("r-a2")
        assert pod is not None
        assert pod["metadata"]["name"] == "r-a2-new", "the newest: a retried submitter's"
        for follow in (False, True):
            assert "".join(cluster.pod_log("r-a2-new", SUBMITTER_CONTAINER, follow=follow)) == "submitted\nstep 1\n"
        with pytest.raises(NotFoundError, match="has not started yet"):
            "".join(cluster.pod_log("r-a3-new", SUBMITTER_CONTAINER, follow=True))
    finally:
        server.shutdown()
        server.server_close()
