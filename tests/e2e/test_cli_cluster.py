"""The cluster side of the ``spotray`` command, through the real entry point on the test bed:
submit creates and updates a TrainingRun, status lists it (in one namespace or all), suspend,
resume and delete act on it, a RUN name resolves through the cluster, and (with the real
controller) watch follows a run to the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from PIL import Image

from spotray.train.storage.local_s3 import LocalS3Server
from tests.conftest import TEST_BUCKET
from tests.e2e.conftest import ROOT, tb

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]


@pytest.fixture(scope="session")
def trainingrun_crd(testbed: tb.Testbed) -> None:
    """The TrainingRun CRD exactly as the controller generates it."""
    crd = subprocess.run(
        [sys.executable, "-m", "spotray.controller.crd"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    testbed.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=crd)
    testbed.kubectl("wait", "--for=condition=Established", "crd/trainingruns.spotray.dev", "--timeout=60s")


def cli(
    testbed: tb.Testbed, extra_env: dict[str, str] | None = None
) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {**os.environ, "KUBECONFIG": str(testbed.kubeconfig), **(extra_env or {})}

    def spotray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spotray.cli", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return spotray


def write_manifest(path: Path, name: str, checkpoint_uri: str, every_steps: int = 20) -> Path:
    document = yaml.safe_load((ROOT / "jobs/gpt2/trainingrun.yaml").read_text())
    document["metadata"] = {"name": name}
    document["spec"]["checkpoint"]["uri"] = checkpoint_uri
    document["spec"]["checkpoint"]["everySteps"] = every_steps
    path.write_text(yaml.safe_dump(document))
    return path


def test_submit_creates_then_updates_and_status_lists_it(
    testbed: tb.Testbed, trainingrun_crd: None, namespace: str, tmp_path: Path
) -> None:
    spotray = cli(testbed)
    manifest = write_manifest(tmp_path / "run.yaml", "cli-run", f"s3://{TEST_BUCKET}/{namespace}/cli-run")

    created = spotray("submit", str(manifest), "-n", namespace)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith(f"trainingrun.spotray.dev/cli-run created (namespace {namespace}")
    assert f"spotray watch cli-run -n {namespace}" in created.stdout
    stored = json.loads(testbed.kubectl("get", "trainingrun", "cli-run", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["checkpoint"]["everySteps"] == 20

    again = spotray("submit", str(manifest), "-n", namespace)
    assert again.returncode == 0, again.stderr
    assert "cli-run unchanged" in again.stdout

    write_manifest(manifest, "cli-run", f"s3://{TEST_BUCKET}/{namespace}/cli-run", every_steps=50)
    updated = spotray("run", str(manifest), "-n", namespace)  # `run` without --local submits
    assert updated.returncode == 0, updated.stderr
    assert "cli-run configured" in updated.stdout
    stored = json.loads(testbed.kubectl("get", "trainingrun", "cli-run", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["checkpoint"]["everySteps"] == 50

    table = spotray("status", "-n", namespace)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "PHASE",
        "ATTEMPT",
        "STEP",
        "LOSS",
        "CHECKPOINT",
        "PREEMPTIONS",
        "FAILURES",
        "GOODPUT",
        "AGE",
    ]
    assert row.split()[0] == "cli-run"

    listing = json.loads(spotray("status", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["namespace"], r["preemptions"]) for r in listing] == [("cli-run", namespace, 0)]
    one = yaml.safe_load(spotray("status", "cli-run", "-n", namespace, "-o", "yaml").stdout)
    assert one["spec"]["checkpoint"]["everySteps"] == 50
    detail = spotray("status", "cli-run", "-n", namespace)
    assert "Name:            cli-run" in detail.stdout

    missing = spotray("status", "no-such-run", "-n", namespace)
    assert missing.returncode == 3
    assert "not found" in missing.stderr


def test_suspend_resume_delete_and_every_namespace_through_the_api_server(
    testbed: tb.Testbed, trainingrun_crd: None, namespace: str, tmp_path: Path
) -> None:
    spotray = cli(testbed)
    manifest = write_manifest(tmp_path / "run.yaml", "verbs", f"s3://{TEST_BUCKET}/{namespace}/verbs")
    assert spotray("submit", str(manifest), "-n", namespace).returncode == 0

    def suspended() -> object:
        run = json.loads(testbed.kubectl("get", "trainingrun", "verbs", "-n", namespace, "-o", "json").stdout)
        return run["spec"].get("suspend")

    paused = spotray("suspend", "verbs", "-n", namespace)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("trainingrun.spotray.dev/verbs suspended")
    assert suspended() is True
    assert "unchanged (already suspended)" in spotray("suspend", "verbs", "-n", namespace).stdout
    resumed = spotray("resume", "verbs", "-n", namespace)
    assert resumed.returncode == 0, resumed.stderr
    assert suspended() is False

    every = spotray("status", "-A")
    assert every.returncode == 0, every.stderr
    header, *rows = every.stdout.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "NAME"]
    assert [namespace, "verbs"] in [row.split()[:2] for row in rows]

    deleted = spotray("delete", "verbs", "-n", namespace)
    assert deleted.returncode == 0, deleted.stderr
    assert "its checkpoints stay in the store" in deleted.stdout
    gone = testbed.kubectl("get", "trainingrun", "verbs", "-n", namespace, check=False)
    assert gone.returncode != 0
    missing = spotray("delete", "verbs", "-n", namespace)
    assert missing.returncode == 3, missing.stdout
    assert "not found" in missing.stderr


def test_a_run_name_resolves_to_its_checkpoint_uri_through_the_cluster(
    testbed: tb.Testbed, trainingrun_crd: None, namespace: str, s3_server: LocalS3Server, tmp_path: Path
) -> None:
    spotray = cli(testbed, s3_server.env())
    uri = f"s3://{TEST_BUCKET}/{namespace}/named"
    assert spotray("submit", str(write_manifest(tmp_path / "run.yaml", "named", uri)), "-n", namespace).returncode == 0
    listing = spotray("checkpoints", "named", "-n", namespace, "-o", "json")
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout) == []
    assert spotray("checkpoints", "nope", "-n", namespace).returncode == 3


# About 100 s: a campaign (make test-campaign), to keep make test within 35 minutes. make test keeps
# its parts: the views' rendering (tests/unit/test_cli_views.py) and, on real pods after a reclaim,
# the goodput ledger in the status, kubectl's table, `spotray status`, `watch` of an ended run, `pull`
# and `plot` (tests/e2e/test_real_pods.py).
@pytest.mark.slow
@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_watch_follows_a_run_to_success_with_the_real_controller(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    trainingrun_crd: None,
    namespace: str,
    s3_server: LocalS3Server,
    tmp_path: Path,
) -> None:
    # The controller process and the small GPT-2 run, as the controller's own e2e tests use them.
    from tests.e2e.controller_harness import (  # noqa: PLC0415
        ControllerProcess,
        allowed_endpoint,
        create_s3_secret,
        training_run,
    )

    create_s3_secret(testbed, namespace, s3_server)
    log = tmp_path / "controller.log"
    controller = ControllerProcess(testbed.kubeconfig, namespace, log, allowed_endpoint(s3_server)).start()
    try:
        manifest = tmp_path / "gpt2.yaml"
        manifest.write_text(yaml.safe_dump(training_run("gpt2", tmp_path, max_steps=20)))
        spotray = cli(testbed, s3_server.env())
        watched = spotray("submit", str(manifest), "-n", namespace, "--watch", timeout=600)
        print(watched.stdout, watched.stderr)
        assert watched.returncode == 0, controller.log_tail()
        assert "attempt 1: RayJob gpt2-a1, starting fresh" in watched.stdout
        assert "phase Succeeded" in watched.stdout
        assert f"spotray pull gpt2 -n {namespace}" in watched.stdout

        detail = spotray("status", "gpt2", "-n", namespace)
        assert "Phase:           Succeeded" in detail.stdout
        assert "Attempts:" in detail.stdout
        # The goodput ledger (issue #16): in status, in kubectl's table and in `spotray status`.
        run = json.loads(testbed.kubectl("get", "trainingrun", "gpt2", "-n", namespace, "-o", "json").stdout)
        goodput = run["status"]["goodput"]
        assert 0 < goodput["ratio"] <= 1
        assert goodput["lostSeconds"]["waitingForCapacity"] >= 0
        accounted = goodput["survivingStepSeconds"] + sum(goodput["lostSeconds"].values())
        assert accounted == pytest.approx(goodput["wallSeconds"], abs=4)  # each part rounded to whole seconds
        assert "GOODPUT" in testbed.kubectl("get", "trainingruns", "-n", namespace).stdout.splitlines()[0]
        assert "Goodput:         " in detail.stdout

        assert spotray("watch", "gpt2", "-n", namespace).returncode == 0  # an ended run: at once

        pulled = spotray("pull", "gpt2", "-n", namespace, str(tmp_path / "final"))
        assert pulled.returncode == 0, pulled.stderr
        assert "pulled checkpoint-20" in pulled.stdout
        assert spotray("plot", "gpt2", "-n", namespace, "--output", str(tmp_path / "loss.png")).returncode == 0
        with Image.open(tmp_path / "loss.png") as image:
            assert image.size == (1320, 550)  # the legend sits beside the axes
    finally:
        controller.stop()
