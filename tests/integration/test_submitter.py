"""The K8sJobMode submitter's argv, run as the kubelet starts it: the spec's text reaches Ray unchanged.

The argv is the controller's RayJob's (controller/rayjob.py), through the kubelet's ``$(VAR)``
expansion (tests/kubelet.py), started with no shell as the kubelet does. It runs the real
submitter (train/launch/submitter.py) and Ray's job SDK against a stand-in for the head's job API on
loopback, which records what it is sent: Ray's own job manager then runs the entrypoint through its
one shell, by design. A retried submitter pod must not submit the job twice (KubeRay issue 2154).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from aiohttp import web

from tests.kubelet import container_argv
from tests.unit.test_rayjob_no_shell import build, kuberay_env

pytestmark = pytest.mark.integration

SUBMISSION_ID = "tiny-a1-x7k2p"
JOB_LOG = "hello from the job\n"


class JobApi:
    """The part of the Ray dashboard's job API that the submitter calls, recording each submission."""

    def __init__(self) -> None:
        self.submissions: list[dict[str, Any]] = []

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "4", "ray_version": ray.__version__, "ray_commit": "test"})

    async def submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.submissions.append(body)
        return web.json_response({"job_id": body["submission_id"], "submission_id": body["submission_id"]})

    async def info(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        submitted = [s for s in self.submissions if s["submission_id"] == job_id]
        if not submitted:
            return web.Response(status=404, text=f"Job {job_id} does not exist")
        details = {"type": "SUBMISSION", "submission_id": job_id, "status": "SUCCEEDED", "message": "done"}
        return web.json_response({**details, "entrypoint": submitted[0]["entrypoint"]})

    async def tail(self, request: web.Request) -> web.WebSocketResponse:
        socket_response = web.WebSocketResponse()
        await socket_response.prepare(request)
        await socket_response.send_str(JOB_LOG)
        await socket_response.close()
        return socket_response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/version", self.version)
        app.router.add_post("/api/jobs/", self.submit)
        app.router.add_get("/api/jobs/{job_id}", self.info)
        app.router.add_get("/api/jobs/{job_id}/logs/tail", self.tail)
        return app


@contextmanager
def serving(api: JobApi) -> Iterator[str]:
    """``api`` on a loopback port, in a thread of its own; yields host:port, as KubeRay gives it."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.app())
    loop.run_until_complete(runner.setup())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    loop.run_until_complete(web.SockSite(runner, listener).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        host, port = listener.getsockname()
        yield f"{host}:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def run_submitter(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # No shell: argv goes to execve as the kubelet's container runtime passes it. `python` is this venv's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    environ = {**os.environ, **env, "PATH": path, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    return subprocess.run(argv, env=environ, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_the_submitter_hands_ray_the_spec_text_unchanged_and_submits_once(tmp_path: Path) -> None:
    hostile = (
        f"$(touch {tmp_path}/pwned-1) `touch {tmp_path}/pwned-2` '; touch {tmp_path}/pwned-3; ' "
        f'"$HOME" $(RAY_JOB_SUBMISSION_ID) $$ $'
    )
    rayjob = build(text=hostile)
    (container,) = rayjob["spec"]["submitterPodTemplate"]["spec"]["containers"]
    api = JobApi()
    with serving(api) as dashboard:
        env = kuberay_env(container, dashboard=dashboard, submission_id=SUBMISSION_ID)
        argv = container_argv(container, env)
        first = run_submitter(argv, env, tmp_path)
        retried = run_submitter(argv, env, tmp_path)

    for result in (first, retried):
        assert result.returncode == 0, result.stderr[-3000:]
        assert JOB_LOG in result.stdout
    assert "(this pod is a retry)" in retried.stderr
    assert list(tmp_path.glob("pwned-*")) == [], "a shell ran the spec's text"
    (submitted,) = api.submissions
    assert submitted["submission_id"] == SUBMISSION_ID
    assert submitted["entrypoint"] == rayjob["spec"]["entrypoint"] == f"python -m spotray.jobs.cnn --note {hostile}"
    expected_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert submitted["runtime_env"]["env_vars"] == expected_env["env_vars"]
    assert submitted["runtime_env"]["env_vars"]["NOTE"] == hostile
    assert json.loads(submitted["runtime_env"]["env_vars"]["SPOTRAY_RUN"])["spec"]["image"].endswith(hostile)
    assert submitted["runtime_env"]["pip"]["packages"] == [hostile]  # Ray's SDK spells a pip list out
