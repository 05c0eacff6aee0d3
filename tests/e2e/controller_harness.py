"""Shared by the e2e tests that run the controller: the controller as a process, the S3 Secret, a small run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from spotray.contract.names import S3_OPT_IN_LABEL
from spotray.train.storage.local_s3 import LocalS3Server
from tests.conftest import TEST_BUCKET
from tests.e2e.conftest import ROOT, tb

SECRET = "s3-credentials"


class ControllerProcess:
    """`python -m spotray.controller` watching one namespace; its log goes to a file the tests print on failure."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path, extra_env: dict[str, str]) -> None:
        self.log_path = log_path
        self.health_port, metrics_port = tb.free_ports(2)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "SPOTRAY_NAMESPACES": namespace,
            "SPOTRAY_SUBMISSION_MODE": "HTTPMode",  # no submitter pod: kwok runs no containers
            "SPOTRAY_RECONCILE_INTERVAL_SECONDS": "1",
            "SPOTRAY_SETTLE_SECONDS": "2",
            "SPOTRAY_METRICS_PORT": str(metrics_port),
            "SPOTRAY_HEALTH_PORT": str(self.health_port),
            # Short, so that every e2e test would catch the watch check failing a busy, healthy
            # controller (a false alarm restarts it in production); stop() asserts it stayed green.
            "SPOTRAY_WATCH_GRACE_SECONDS": "15",
            **extra_env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spotray.controller"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        tb.wait_until("the controller's /healthz", self.healthy, timeout=60, interval=0.5)
        return self

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the controller exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it; first assert /healthz is still green (the watch check never cried wolf)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        green = self.healthy() or self._green_again_within(6)  # one slow answer is not a failure
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert green, f"the controller's /healthz failed while it was working:\n{self.log_tail()}"

    def _green_again_within(self, seconds: float) -> bool:
        try:
            return bool(tb.wait_until("/healthz", self.healthy, timeout=seconds, interval=1))
        except TimeoutError:
            return False

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def create_s3_secret(testbed: tb.Testbed, namespace: str, s3_server: LocalS3Server, *, opt_in: bool = True) -> str:
    """The run's S3 Secret; ``opt_in`` labels it for use by spotray (controller/s3_access.py)."""
    env = s3_server.env()
    keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    literals = [f"--from-literal={key}={env[key]}" for key in keys]
    testbed.kubectl("create", "secret", "generic", SECRET, "-n", namespace, *literals)
    if opt_in:
        testbed.kubectl("label", "secret", SECRET, "-n", namespace, f"{S3_OPT_IN_LABEL}=true")
    return SECRET


def allowed_endpoint(s3_server: LocalS3Server) -> dict[str, str]:
    """The controller setting that lets it connect to the test's S3 server (the chart's s3.allowedEndpoints)."""
    return {"SPOTRAY_ALLOWED_S3_ENDPOINTS": s3_server.endpoint_url}


def training_run(name: str, tmp_path: Path, *, max_steps: int, entrypoint: str | None = None) -> dict[str, Any]:
    """The GPT-2 example's manifest, made small: one CPU worker, a checkpoint every 10 steps."""
    document = yaml.safe_load((ROOT / "jobs" / "gpt2" / "trainingrun.yaml").read_text())
    document["metadata"] = {"name": name}
    spec = document["spec"]
    spec["entrypoint"] = entrypoint or (
        f"python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size 8 --workdir {tmp_path / 'job'}"
    )
    spec["workers"] = {"replicas": 1, "cpu": "1", "memory": "2Gi"}
    spec["checkpoint"] = {
        "uri": f"s3://{TEST_BUCKET}/{tmp_path.name}/{name}",
        "everySteps": 10,
        "keep": 3,
        "secretRef": SECRET,
    }
    spec["data"] = {"uri": f"s3://{TEST_BUCKET}/datasets/gpt2-e2e"}
    spec["retry"] = {"maxPreemptions": 3, "maxFailures": 1, "backoffSeconds": 1}
    return document
