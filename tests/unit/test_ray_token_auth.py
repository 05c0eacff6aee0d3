"""Ray's token auth on each run's Ray cluster (issue #38, item 2): the controller's part and the CLI's.

KubeRay does the rest (authOptions mode token, v1.6.1): it makes a Secret with a random token per
RayCluster, owned by it, and sets RAY_AUTH_MODE and RAY_AUTH_TOKEN on the Ray containers, the
wait-gcs-ready init container and the submitter. That it holds on real pods (the dashboard refuses a
caller without the token, training, the preStop drain and the resume still work, `spotray logs`
with and without it) is tests/e2e/test_real_pods.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from spotray.cli.exit_codes import CommandFailedError
from spotray.cli.logs import RAY_TOKEN_ENV, logs_command, ray_token_secret_name
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob
from tests.unit.test_run_checkpoint_key import ray_containers
from tests.unit.test_status_unreadable import body

pytestmark = pytest.mark.unit

TOKEN = "t0ken-of-the-cluster"


def rayjob(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    return build_rayjob(parse_training_run(body(tmp_path, None)), 1, "uid", ControllerConfig.from_env(env))


def test_token_auth_asks_kuberay_for_a_token_per_cluster_and_sets_no_auth_variable_itself(tmp_path: Path) -> None:
    built = rayjob(tmp_path, {"SPOTRAY_RAY_TOKEN_AUTH": "true"})
    assert built["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}  # no secretName: KubeRay makes one
    # KubeRay keeps a RAY_AUTH_* entry a container already has (RAY_AUTH_MODE=disabled would win).
    submitter = built["spec"]["submitterPodTemplate"]["spec"]["containers"]
    for container in [*ray_containers(built), *submitter]:
        assert not [e for e in container.get("env", []) if e["name"].startswith("RAY_AUTH")], container


def test_token_auth_is_off_unless_configured_and_absent_on_a_shared_cluster(tmp_path: Path) -> None:
    assert "authOptions" not in rayjob(tmp_path, {})["spec"]["rayClusterSpec"]
    shared = {"SPOTRAY_RAY_TOKEN_AUTH": "true", "SPOTRAY_RAY_CLUSTER_SELECTOR": '{"ray.io/cluster": "shared"}'}
    # The chart's RayCluster has its own authOptions; its RayJobs' submitters get its token from KubeRay.
    assert "rayClusterSpec" not in rayjob(tmp_path, shared)["spec"]


@pytest.mark.parametrize("version", ["2.52.0", "2.60.0", "2.60.0rc1", "3.0.0"])
def test_a_ray_with_token_auth_is_accepted(version: str) -> None:
    config = ControllerConfig.from_env({"SPOTRAY_RAY_TOKEN_AUTH": "true", "SPOTRAY_RAY_VERSION": version})
    assert config.ray_token_auth


@pytest.mark.parametrize(
    ("version", "said"), [("2.51.2", "needs Ray 2.52.0 or newer, not 2.51.2"), ("latest", "a Ray release like 2.60.0")]
)
def test_a_ray_version_kuberay_refuses_token_auth_for_stops_the_controller_at_start(version: str, said: str) -> None:
    # KubeRay would otherwise refuse every RayJob's cluster, one by one, after the controller made them.
    with pytest.raises(SpotrayError) as caught:
        ControllerConfig.from_env({"SPOTRAY_RAY_TOKEN_AUTH": "true", "SPOTRAY_RAY_VERSION": version})
    assert said in str(caught.value)
    assert "rayTokenAuth.enabled=false" in str(caught.value) or "ray.version" in str(caught.value)
    assert not ControllerConfig.from_env({"SPOTRAY_RAY_VERSION": version}).ray_token_auth


def test_the_token_secrets_name_is_the_cluster_name_as_kuberay_shortens_it() -> None:
    # KubeRay v1.6.1 utils.CheckName: the last 50 characters; a leading digit or punctuation becomes "r".
    assert ray_token_secret_name("gpt2-a2-raycluster-x7k2p") == "gpt2-a2-raycluster-x7k2p"
    long = "a" * 11 + "-" + "b" * 49  # 61 characters: the last 50 start at the "-"
    assert ray_token_secret_name(long) == "r" + "b" * 49
    assert ray_token_secret_name("9" + "c" * 20) == "r" + "c" * 20
    assert len(ray_token_secret_name("x" * 80)) == 50


class Dashboard(BaseHTTPRequestHandler):
    """Ray's job logs endpoint as Ray 2.60 answers with token auth on: 401 without a token, 403 with a wrong one."""

    def do_GET(self) -> None:
        header = self.headers.get("Authorization")
        code = 200 if header == f"Bearer {TOKEN}" else (403 if header else 401)
        payload = b'{"logs": "step 1\\n"}' if code == 200 else b"Unauthorized"
        self.send_response(code)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def dashboard() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class ClusterWithARayJob:
    namespace = "team"

    def get_run(self, name: str) -> dict[str, Any]:
        return {"status": {"attempt": 2}}

    def get_ray_job(self, name: str) -> dict[str, Any]:
        return {"status": {"jobId": "gpt2-a2-x7k2p", "rayClusterName": "gpt2-a2-raycluster-x7k2p"}}


def test_logs_send_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv(RAY_TOKEN_ENV, TOKEN)
    with dashboard() as url:
        assert logs_command(ClusterWithARayJob(), "gpt2", None, url) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out == "step 1\n"


@pytest.mark.parametrize(("token", "said"), [(None, "RAY_AUTH_TOKEN is not set"), ("wrong", "refused the token")])
def test_logs_refused_for_the_token_say_which_secret_holds_it(
    monkeypatch: pytest.MonkeyPatch, token: str | None, said: str
) -> None:
    if token is None:
        monkeypatch.delenv(RAY_TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(RAY_TOKEN_ENV, token)
    with dashboard() as url, pytest.raises(CommandFailedError) as caught:
        logs_command(ClusterWithARayJob(), "gpt2", None, url)  # type: ignore[arg-type]
    text = str(caught.value)
    assert said in text
    assert "Ray's token auth is on" in text
    assert (
        "RAY_AUTH_TOKEN=$(kubectl get secret gpt2-a2-raycluster-x7k2p -n team -o jsonpath='{.data.auth_token}' "
        f"| base64 -d) spotray logs gpt2 -n team --attempt 2 --dashboard {url}"
    ) in text
