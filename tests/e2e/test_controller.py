"""The spotray controller on the real test bed: TrainingRun -> RayJob per attempt -> real KubeRay ->
the job trains for real on the local Ray head (through the bridge) with checkpoints in SeaweedFS.

The controller runs as a process (`python -m spotray.controller`), as the chart's Deployment would run it,
against the test bed's API server; pods on kwok nodes run nothing, the bridge sends the RayJob's
submission to the local Ray head, and the head's jobs have the environment the pods would have.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.names import S3_OPT_IN_LABEL
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.records.progress_log import read_run_progress
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore
from testbed.prometheus import Prometheus
from tests.e2e.conftest import ROOT, tb
from tests.e2e.controller_harness import SECRET, ControllerProcess, allowed_endpoint, create_s3_secret, training_run

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

CRD = ROOT / "charts" / "spotray" / "crds" / "trainingruns.spotray.dev.yaml"
SPOT_RUN_STEPS = 150
TERMINAL = ("Succeeded", "Failed")
SUSPEND, UNSUSPEND = '{"spec": {"suspend": true}}', '{"spec": {"suspend": false}}'


def finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed")


@pytest.fixture(scope="session")
def training_run_crd(testbed: tb.Testbed) -> None:
    testbed.kubectl("apply", "--server-side", "-f", str(CRD))
    testbed.kubectl("wait", "--for=condition=Established", "crd/trainingruns.spotray.dev", "--timeout=60s")


@pytest.fixture
def s3_secret(testbed: tb.Testbed, namespace: str, s3_server: LocalS3Server) -> str:
    return create_s3_secret(testbed, namespace, s3_server)


@pytest.fixture
def start_controller(
    testbed: tb.Testbed, namespace: str, training_run_crd: None, s3_server: LocalS3Server, tmp_path: Path
) -> Iterator[Callable[..., ControllerProcess]]:
    started: list[ControllerProcess] = []

    def start(kubeconfig: Path | None = None, **extra_env: str) -> ControllerProcess:
        env = {**allowed_endpoint(s3_server), **extra_env}
        config = kubeconfig or testbed.kubeconfig
        process = ControllerProcess(config, namespace, tmp_path / "controller.log", env)
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()
    print(f"--- controller log ({tmp_path / 'controller.log'}) ---")
    if (tmp_path / "controller.log").exists():
        print(started[-1].log_tail(120) if started else "")


def get(testbed: tb.Testbed, kind: str, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(testbed.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)
    return found


def rayjobs(testbed: tb.Testbed, namespace: str, run: str) -> list[str]:
    out = testbed.kubectl("get", "rayjobs", "-n", namespace, "-l", f"spotray.dev/run={run}", "-o", "name").stdout
    return sorted(line.split("/", 1)[1] for line in out.split())


def wait_status(
    testbed: tb.Testbed, namespace: str, name: str, what: str, check: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status = get(testbed, "trainingrun", name, namespace).get("status") or {}
        return status if check(status) else None

    try:
        result: dict[str, Any] = tb.wait_until(f"TrainingRun {name}: {what}", ready, timeout=timeout, interval=1)
    except TimeoutError:
        print(yaml.safe_dump(get(testbed, "trainingrun", name, namespace).get("status")))
        raise
    return result


def training_past_a_checkpoint(
    testbed: tb.Testbed, namespace: str, name: str, tmp_path: Path
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A GPT-2 run applied and trained past its first complete checkpoint: (its manifest, attempt 1's
    RayJob, the spot node its worker runs on). Enough steps that a node is lost mid-run even on a
    fast machine: the checkpoint (step 10) must reach the status and the test must find and delete
    the node before training ends."""
    manifest = training_run(name, tmp_path, max_steps=SPOT_RUN_STEPS)
    testbed.apply(manifest, namespace=namespace)
    wait_status(testbed, namespace, name, "a complete checkpoint", lambda s: "lastCheckpoint" in s, 600)
    job = get(testbed, "rayjob", f"{name}-a1", namespace)
    pods = json.loads(
        testbed.kubectl("get", "pods", "-n", namespace, "-l", "spotray.dev/attempt=1", "-o", "json").stdout
    )["items"]
    spot_node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker")
    return manifest, job, spot_node


# About three minutes. In make test the same story runs twice: the installed controller through a
# lost spot node (test_chart_install, NodeLost) and the real-pods reclaim (test_real_pods, SpotNotice,
# with resumedFrom, lastCheckpoint and the Events checked as here).
@pytest.mark.campaign
def test_spot_node_lost_mid_run_counts_a_preemption_and_attempt_two_resumes_then_succeeds_with_status(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    controller = start_controller()
    # A real Prometheus scrapes the controller all along, as a user's would (issue 72, item 5).
    prometheus = Prometheus(testbed, [f"127.0.0.1:{controller.env['SPOTRAY_METRICS_PORT']}"]).start()
    manifest, job, spot_node = training_past_a_checkpoint(testbed, namespace, "spot", tmp_path)

    # The cloud takes the spot VM: its pods are disrupted and the training processes die with it.
    testbed.preempt_node(spot_node)
    try:
        assert ray_head.kill_job(job["status"]["jobId"])
        store = S3ObjectStore(parse_uri(manifest["spec"]["checkpoint"]["uri"]), s3_server.config, RetryPolicy())
        latest = latest_complete_checkpoint(store)
        assert latest is not None
        status = wait_status(testbed, namespace, "spot", "attempt 2", lambda s: s.get("attempt") == 2, 120)
    finally:
        testbed.restore_node(spot_node)

    first = status["attempts"][0]
    assert (first["outcome"], first["reason"]) == ("Preempted", "NodeLost")
    assert spot_node in first["message"]
    assert (status["preemptions"], status["failures"]) == (1, 0)
    status = wait_status(
        testbed, namespace, "spot", "Succeeded", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600
    )
    assert status["phase"] == "Succeeded", status
    assert status["attempts"][1]["resumedFrom"] == latest.step
    for attempt in status["attempts"]:  # where each start-up went (controller/startup.py), read once
        startup = attempt["startup"]
        assert 0 <= startup["podsReady"] <= startup["trainingLoop"] <= startup["firstStep"], attempt
    # What a finished run's status says, from S3: progress, the last complete checkpoint.
    assert status["progress"]["step"] == status["progress"]["totalSteps"] == SPOT_RUN_STEPS
    assert status["lastCheckpoint"]["step"] == SPOT_RUN_STEPS
    assert status["lastCheckpoint"]["uri"].endswith(f"/spot/checkpoint-{SPOT_RUN_STEPS}")
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True"
    # The preempted attempt's RayJob was deleted once judged, so its cluster held no capacity.
    assert rayjobs(testbed, namespace, "spot") == ["spot-a2"]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "TrainingRun"
    events = testbed.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=spot").stdout
    for reason in ("AttemptStarted", "NodeLost", "Succeeded"):
        assert reason in events
    check_metrics_in_prometheus(prometheus, namespace, "spot")


DASHBOARD = ROOT / "charts" / "spotray" / "dashboards" / "spotray.json"


def check_metrics_in_prometheus(prometheus: Prometheus, namespace: str, run: str) -> None:
    """PromQL on what Prometheus scraped: the run's step and preemptions, and a series for every query
    of the chart's Grafana dashboard, its variables set to this run as Grafana would."""
    tb.wait_until("Prometheus scraping the controller", prometheus.targets_up, timeout=30)
    labels = f'namespace="{namespace}",run="{run}"'

    def value(expr: str) -> float:
        samples = prometheus.query(expr)
        assert len(samples) == 1, (expr, samples)
        return float(samples[0]["value"][1])

    # The endpoint has the status's final values once the reconcile that wrote them is over, and
    # Prometheus a scrape (a second) later: the test read the status first.
    succeeded = f'spotray_run_phase{{{labels},phase="Succeeded"}}'
    tb.wait_until("the run's end in Prometheus", lambda: value(succeeded) == 1, timeout=30)
    assert value(f"spotray_run_step{{{labels}}}") == SPOT_RUN_STEPS
    assert value(f"spotray_run_preemptions{{{labels}}}") == 1
    assert value(f"spotray_run_failures{{{labels}}}") == 0
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]
    assert len(queries) >= 8, queries
    for title, expr in queries:
        concrete = expr.replace("$namespace", namespace).replace("$run", run)
        assert prometheus.query(concrete), f"dashboard panel {title!r}: {concrete} gave no series"


# Three minutes (a training run, a controller down while its node goes): the unit tests of
# tests/unit/test_node_loss_read_back.py hold the decision in make test.
@pytest.mark.campaign
def test_a_spot_node_lost_while_the_controller_is_down_counts_a_preemption_not_a_failure(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """The controller SIGKILLed, then the spot node reclaimed (pods marked, node and pods deleted, the
    job killed), then the controller back: nothing watched the pods go, and the attempt used to be
    judged TrainingFailed. It is read back from the scheduler's Events and the Nodes: NodeLost."""
    controller = start_controller()
    _, job, spot_node = training_past_a_checkpoint(testbed, namespace, "away", tmp_path)

    controller.stop(signal.SIGKILL)
    testbed.preempt_node(spot_node)
    try:
        ray_head.kill_job(job["status"]["jobId"])
        tb.wait_until(
            "RayJob away-a1 to fail",
            lambda: (get(testbed, "rayjob", "away-a1", namespace).get("status") or {}).get("jobStatus") == "FAILED",
            timeout=120,
        )
        start_controller()
        status = wait_status(testbed, namespace, "away", "attempt 1 judged", lambda s: s.get("attempt") == 2, 120)
    finally:
        testbed.restore_node(spot_node)
    first = status["attempts"][0]
    assert (first["outcome"], first["reason"]) == ("Preempted", "NodeLost"), first
    assert spot_node in first["message"]
    assert (status["preemptions"], status.get("failures", 0)) == (1, 0)
    status = wait_status(testbed, namespace, "away", "the end", lambda s: s.get("phase") in TERMINAL, 600)
    assert status["phase"] == "Succeeded", status


def test_training_failures_spend_the_failure_budget_and_end_in_failed(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    controller = start_controller()
    crash = "python -c 'import sys; print(\"loss is NaN\"); sys.exit(1)'"
    testbed.apply(training_run("broken", tmp_path, max_steps=10, entrypoint=crash), namespace=namespace)

    status = wait_status(testbed, namespace, "broken", "Failed", lambda s: s.get("phase") == "Failed", 300)

    assert (status["failures"], status["preemptions"]) == (2, 0)  # maxFailures=1: one retry, then stop
    assert [a["outcome"] for a in status["attempts"]] == ["Failed", "Failed"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "FailureBudgetExhausted")
    assert "maxFailures=1" in failed["message"]
    assert rayjobs(testbed, namespace, "broken") == ["broken-a1", "broken-a2"]
    # What the user runs next: the failed attempt's driver log, through the real CLI.
    logs = subprocess.run(
        [sys.executable, "-m", "spotray.cli", "logs", "broken", "--attempt", "2", "-n", namespace,
         "--kubeconfig", str(testbed.kubeconfig), "--dashboard", ray_head.dashboard_url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert logs.returncode == 0, logs.stderr
    assert "loss is NaN" in logs.stdout

    port = controller.env["SPOTRAY_METRICS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'spotray_attempt_outcomes_total{outcome="Failed"} 2.0' in metrics
    assert 'spotray_trainingruns{phase="Failed"} 1.0' in metrics
    assert "spotray_reconcile_seconds_count" in metrics
    # Per run, from the status the controller wrote (issue 72).
    run_labels = f'namespace="{namespace}",run="broken"'
    assert f"spotray_run_failures{{{run_labels}}} 2.0" in metrics
    assert f"spotray_run_attempt{{{run_labels}}} 2.0" in metrics
    assert f'spotray_run_phase{{namespace="{namespace}",phase="Failed",run="broken"}} 1.0' in metrics

    # Deleting the run deletes its RayJobs (owner references; the garbage collector does it).
    testbed.kubectl("delete", "trainingrun", "broken", "-n", namespace)
    tb.wait_until("the run's RayJobs to go", lambda: rayjobs(testbed, namespace, "broken") == [], timeout=60)

    # Bad input the job could not record (exit code 2 before it reached the store): read from the
    # RayJob's message, where KubeRay copies Ray's "failed with exit code 2", it fails the run at once.
    refuse = "python -c 'import sys; print(\"error: no S3 credentials were found\"); sys.exit(2)'"
    testbed.apply(training_run("refused", tmp_path, max_steps=10, entrypoint=refuse), namespace=namespace)
    status = wait_status(testbed, namespace, "refused", "Failed", lambda s: s.get("phase") == "Failed", 300)
    assert [(a["outcome"], a["reason"]) for a in status["attempts"]] == [("Failed", "BadInput")]
    assert "error: no S3 credentials were found" in status["message"]
    assert rayjobs(testbed, namespace, "refused") == ["refused-a1"], "no second attempt for bad input"


# About a minute: a campaign (make test-campaign), to keep make test within its 35 minutes. In make
# test the nemesis smoke checks the same promise (each RayJob created once, from the audit log)
# through an API server killed in an attempt's start-up; this one crashes the controller at the
# exact moment, between the RayJob's creation and the status that records it.
@pytest.mark.campaign
def test_controller_killed_between_rayjob_and_status_creates_exactly_one_rayjob_after_restart(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    doomed = start_controller(SPOTRAY_CRASH_AT="rayjob-created")
    sleeper = "python -c 'import time; time.sleep(45)'"  # long enough to be seen Running after a restart
    testbed.apply(training_run("restart", tmp_path, max_steps=10, entrypoint=sleeper), namespace=namespace)
    assert doomed.proc is not None
    assert doomed.proc.wait(timeout=60) == 70, doomed.log_tail()
    status = get(testbed, "trainingrun", "restart", namespace).get("status") or {}
    assert status.get("attempt") in (None, 0)  # never recorded...
    assert rayjobs(testbed, namespace, "restart") == ["restart-a1"]  # ...but its RayJob was created

    restarted = start_controller()
    status = wait_status(testbed, namespace, "restart", "running", lambda s: s.get("phase") == "Running", 120)
    assert status["attempt"] == 1
    assert rayjobs(testbed, namespace, "restart") == ["restart-a1"]

    # And a plain SIGKILL in the middle of the attempt changes nothing either.
    restarted.stop(signal.SIGKILL)
    start_controller()
    status = wait_status(testbed, namespace, "restart", "Succeeded", lambda s: s.get("phase") == "Succeeded", 120)
    assert status["attempt"] == 1
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"]
    assert rayjobs(testbed, namespace, "restart") == ["restart-a1"]


# About 70 s: the nemesis smoke (tests/e2e/test_nemesis_smoke.py) deletes a RayJob mid-attempt in make test.
@pytest.mark.campaign
def test_a_rayjob_deleted_mid_attempt_is_judged_once_and_its_number_never_used_again(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """`kubectl delete rayjob <run>-a1` while it runs (or KubeRay's TTL while the controller was away):
    attempt 1 is judged from what it left (no record: nothing spent) and attempt 2 runs as
    `<run>-a2`. Before, `<run>-a1` was created again and believed the first one's records."""
    start_controller()
    sleeper = "python -c 'import time; time.sleep(30)'"
    testbed.apply(training_run("deleted", tmp_path, max_steps=10, entrypoint=sleeper), namespace=namespace)
    wait_status(testbed, namespace, "deleted", "running", lambda s: s.get("phase") == "Running", 120)
    job = get(testbed, "rayjob", "deleted-a1", namespace)
    testbed.kubectl("delete", "rayjob", "deleted-a1", "-n", namespace, "--wait=true")
    ray_head.kill_job(job["status"]["jobId"])  # its pods' processes go with it (kwok pods run nothing)

    status = wait_status(testbed, namespace, "deleted", "Succeeded", lambda s: s.get("phase") in TERMINAL, 180)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["attempt"], first["outcome"], first["reason"]) == (1, "Interrupted", "RayJobGone")
    assert (second["attempt"], second["rayJob"], second["outcome"]) == (2, "deleted-a2", "Succeeded")
    assert (status.get("preemptions", 0), status.get("failures", 0)) == (0, 0)
    assert rayjobs(testbed, namespace, "deleted") == ["deleted-a2"], "deleted-a1 was never made again"


# About 55 s: the nemesis smoke (tests/e2e/test_nemesis_smoke.py) kills the API server as an attempt
# starts, in make test.
@pytest.mark.campaign
def test_the_api_server_lost_mid_attempt_changes_no_outcome(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """The kube-apiserver SIGKILLed while an attempt runs, and back 8 s later: no attempt lost or added."""
    controller = start_controller()
    sleeper = "python -c 'import time; time.sleep(40)'"
    testbed.apply(training_run("apiserver-lost", tmp_path, max_steps=10, entrypoint=sleeper), namespace=namespace)
    wait_status(testbed, namespace, "apiserver-lost", "running", lambda s: s.get("phase") == "Running", 120)

    testbed.restart_apiserver(down_s=8)
    status = wait_status(
        testbed, namespace, "apiserver-lost", "Succeeded", lambda s: s.get("phase") == "Succeeded", 240
    )
    assert status["attempt"] == 1
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"]
    assert (status["preemptions"], status["failures"]) == (0, 0)
    assert rayjobs(testbed, namespace, "apiserver-lost") == ["apiserver-lost-a1"]
    assert controller.proc is not None
    assert controller.proc.poll() is None, f"the controller died with the API server:\n{controller.log_tail()}"
    # (the fixture's stop() then asserts /healthz is green: the watch caught up after the restart)


def test_suspend_stops_the_attempt_and_resume_starts_the_next(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    start_controller()
    sleeper = "python -c 'import time; time.sleep(120)'"
    testbed.apply(training_run("pausable", tmp_path, max_steps=10, entrypoint=sleeper), namespace=namespace)
    wait_status(testbed, namespace, "pausable", "running", lambda s: s.get("phase") == "Running", 120)

    testbed.kubectl(
        "patch", "trainingrun", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    status = wait_status(testbed, namespace, "pausable", "Suspended", lambda s: s.get("phase") == "Suspended", 60)
    assert status["attempts"][0]["outcome"] == "Suspended"
    tb.wait_until("the suspended attempt's RayJob to go", lambda: rayjobs(testbed, namespace, "pausable") == [], 60)

    testbed.kubectl(
        "patch", "trainingrun", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    status = wait_status(testbed, namespace, "pausable", "attempt 2", lambda s: s.get("attempt") == 2, 60)
    assert (status["preemptions"], status["failures"]) == (0, 0)
    tb.wait_until("attempt 2's RayJob", lambda: rayjobs(testbed, namespace, "pausable") == ["pausable-a2"], 60)


def test_a_missing_then_unlabelled_s3_secret_is_named_with_the_fix_and_the_run_starts_once_it_is_usable(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    start_controller()
    sleeper = "python -c 'print(1)'"
    testbed.apply(training_run("no-secret", tmp_path, max_steps=10, entrypoint=sleeper), namespace=namespace)

    status = wait_status(testbed, namespace, "no-secret", "waiting", lambda s: SECRET in s.get("message", ""), 60)
    assert "kubectl create secret generic" in status["message"]
    assert status.get("attempt", 0) == 0
    assert rayjobs(testbed, namespace, "no-secret") == []

    # A Secret that does not opt in is neither read nor injected: the run keeps waiting and says why.
    create_s3_secret(testbed, namespace, s3_server, opt_in=False)
    status = wait_status(testbed, namespace, "no-secret", "refused", lambda s: "not marked" in s.get("message", ""), 60)
    assert f"kubectl label secret {SECRET} -n {namespace} {S3_OPT_IN_LABEL}=true" in status["message"]
    assert status.get("attempt", 0) == 0
    assert rayjobs(testbed, namespace, "no-secret") == []

    testbed.kubectl("label", "secret", SECRET, "-n", namespace, f"{S3_OPT_IN_LABEL}=true")
    wait_status(testbed, namespace, "no-secret", "Succeeded", lambda s: s.get("phase") == "Succeeded", 120)
    assert rayjobs(testbed, namespace, "no-secret") == ["no-secret-a1"]


def test_a_secret_pointing_the_controller_at_another_endpoint_is_refused(
    testbed: tb.Testbed,
    namespace: str,
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """Server-side request forgery: the Secret's AWS_ENDPOINT_URL is not one the operator allowed."""
    testbed.kubectl(
        "create", "secret", "generic", SECRET, "-n", namespace,
        "--from-literal=AWS_ENDPOINT_URL=http://127.0.0.1:1/latest/meta-data", "--from-literal=AWS_ACCESS_KEY_ID=x",
        "--from-literal=AWS_SECRET_ACCESS_KEY=y",
    )  # fmt: skip
    testbed.kubectl("label", "secret", SECRET, "-n", namespace, f"{S3_OPT_IN_LABEL}=true")
    start_controller()
    testbed.apply(training_run("forged", tmp_path, max_steps=10), namespace=namespace)
    status = wait_status(
        testbed, namespace, "forged", "refused", lambda s: "not one the controller" in s.get("message", ""), 60
    )
    assert "s3.allowedEndpoints" in status["message"]
    assert status.get("attempt", 0) == 0
    assert rayjobs(testbed, namespace, "forged") == []


def test_an_attempt_whose_pods_are_refused_ends_at_the_start_deadline_not_never(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """A quota of zero pods: the API server refuses every pod KubeRay makes, and the RayJob would
    stay Initializing for ever. The attempt ends at the deadline, spends a failure, and is deleted."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    testbed.apply(quota, namespace=namespace)
    start_controller(SPOTRAY_START_DEADLINE_SECONDS="15")
    document = training_run("stuck", tmp_path, max_steps=10)
    document["spec"]["retry"] = {"maxFailures": 0, "backoffSeconds": 1}
    testbed.apply(document, namespace=namespace)

    status = wait_status(testbed, namespace, "stuck", "Failed", lambda s: s.get("phase") == "Failed", 120)
    (attempt,) = status["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "StartDeadlineExceeded")
    assert "did not start within 15 s" in attempt["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailureBudgetExhausted"
    tb.wait_until("the stuck RayJob to be deleted", lambda: rayjobs(testbed, namespace, "stuck") == [], 60)


def events_of(testbed: tb.Testbed, namespace: str, name: str) -> list[dict[str, Any]]:
    found = testbed.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(found)["items"]
    return items


def test_a_rayjob_refused_by_a_quota_waits_saying_so_and_the_same_attempt_starts_once_it_is_lifted(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """The real API server's quota admission refuses the RayJob (403, "exceeded quota"): no budget is
    spent, the status says why, and once the quota is lifted attempt 1 (not 2) is created."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-rayjobs"},
        "spec": {"hard": {"count/rayjobs.ray.io": "0"}},
    }
    testbed.apply(quota, namespace=namespace)
    # Quota admission refuses everything until the quota controller has computed the usage.
    tb.wait_until(
        "the quota's usage to be computed",
        lambda: (get(testbed, "resourcequota", "no-rayjobs", namespace).get("status") or {}).get("used"),
        timeout=60,
    )
    start_controller()
    testbed.apply(training_run("quota", tmp_path, max_steps=10), namespace=namespace)

    status = wait_status(
        testbed, namespace, "quota", "the refusal said", lambda s: "exceeded quota" in s.get("message", ""), 60
    )
    assert status["phase"] == "Pending"
    assert [(a["attempt"], a["outcome"]) for a in status["attempts"]] == [(1, "Running")]
    assert (status.get("failures", 0), status.get("preemptions", 0)) == (0, 0)
    assert rayjobs(testbed, namespace, "quota") == []
    assert "exceeded quota" in testbed.kubectl("get", "trainingrun", "quota", "-n", namespace).stdout
    tb.wait_until(
        "a RayJobRefused Event",
        lambda: any(e["reason"] == "RayJobRefused" for e in events_of(testbed, namespace, "quota")),
        timeout=30,
    )

    testbed.kubectl("delete", "resourcequota", "no-rayjobs", "-n", namespace)
    tb.wait_until("RayJob quota-a1", lambda: rayjobs(testbed, namespace, "quota") == ["quota-a1"], timeout=90)
    status = get(testbed, "trainingrun", "quota", namespace)["status"]
    assert [a["attempt"] for a in status["attempts"]] == [1]


def test_a_rayjob_denied_by_an_admission_policy_ends_at_the_start_deadline_naming_the_policy(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """A ValidatingAdmissionPolicy denies every RayJob in the namespace (422 Invalid, an
    administrator's rule, so tried again): the attempt ends at the start deadline, not never."""
    policy_name = f"deny-rayjobs-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["ray.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": ["rayjobs"],
                    }
                ]
            },
            "validations": [{"expression": "false", "message": "RayJobs need an approval here"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    testbed.apply(policy, binding)
    try:
        probe = {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": "probe"},
            "spec": {"entrypoint": "true"},
        }

        def denied() -> bool:
            refused = testbed.kubectl(
                "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(probe), check=False
            )
            return refused.returncode != 0 and "RayJobs need an approval here" in refused.stderr

        tb.wait_until("the policy to be enforced", denied, timeout=60, interval=1)
        start_controller(SPOTRAY_START_DEADLINE_SECONDS="15")
        document = training_run("denied", tmp_path, max_steps=10)
        document["spec"]["retry"] = {"maxFailures": 0, "backoffSeconds": 1}
        testbed.apply(document, namespace=namespace)

        waiting = wait_status(
            testbed, namespace, "denied", "the denial said", lambda s: "approval" in s.get("message", ""), 60
        )
        assert waiting["phase"] == "Pending"
        status = wait_status(testbed, namespace, "denied", "Failed", lambda s: s.get("phase") == "Failed", 90)
        (attempt,) = status["attempts"]
        assert (attempt["outcome"], attempt["reason"]) == ("Failed", "StartDeadlineExceeded")
        assert "never created" in attempt["message"]
        assert "RayJobs need an approval here" in attempt["message"]
        assert rayjobs(testbed, namespace, "denied") == []
    finally:
        testbed.kubectl("delete", "validatingadmissionpolicybinding", policy_name, "--ignore-not-found")
        testbed.kubectl("delete", "validatingadmissionpolicy", policy_name, "--ignore-not-found")


def test_a_rayjob_kuberay_refuses_fails_the_run_at_once_with_kuberays_words(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """The real KubeRay marks a RayJob ValidationFailed (here: a head without containers, which the
    API server's schema lets through) and never runs it: the run fails at once, not after a start
    deadline per attempt. The controller's own RayJobs never look like this, so the test makes one
    under the run's name, owned by the run, before the controller starts."""
    testbed.apply(training_run("invalid", tmp_path, max_steps=10), namespace=namespace)
    run = get(testbed, "trainingrun", "invalid", namespace)
    head = {"rayStartParams": {}, "template": {"spec": {"containers": []}}}
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "invalid-a1",
            "labels": {"spotray.dev/run": "invalid", "spotray.dev/attempt": "1"},
            "ownerReferences": [
                {
                    "apiVersion": "spotray.dev/v1alpha1",
                    "kind": "TrainingRun",
                    "name": "invalid",
                    "uid": run["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"entrypoint": "true", "rayClusterSpec": {"headGroupSpec": head}},
    }
    testbed.apply(rayjob, namespace=namespace)
    tb.wait_until(
        "KubeRay's verdict on RayJob invalid-a1",
        lambda: (
            (get(testbed, "rayjob", "invalid-a1", namespace).get("status") or {}).get("jobDeploymentStatus")
            == "ValidationFailed"
        ),
        timeout=60,
    )
    start_controller()

    status = wait_status(testbed, namespace, "invalid", "Failed", lambda s: s.get("phase") == "Failed", 60)
    (attempt,) = status["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("Failed", "BadInput")
    assert "KubeRay refused RayJob invalid-a1 (ValidationFailed)" in status["message"]
    assert "container" in status["message"], "KubeRay's own words say what is wrong"
    tb.wait_until("the refused RayJob to be deleted", lambda: rayjobs(testbed, namespace, "invalid") == [], 60)


def test_a_rayjob_left_by_another_run_of_the_same_name_is_never_adopted(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """A run deleted and created again before garbage collection used to adopt the old run's RayJob on
    the 409 (and a SUCCEEDED one made the new run Succeeded without training). Here the old RayJob's
    owner is a ConfigMap standing in for the deleted run, so it stays until that owner goes."""
    testbed.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old-run"}}, namespace=namespace)
    owner_uid = get(testbed, "configmap", "old-run", namespace)["metadata"]["uid"]
    foreign = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "reborn-a1",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "old-run", "uid": owner_uid, "controller": True}
            ],
        },
        # Suspended, so KubeRay starts no cluster for it.
        "spec": {"entrypoint": "python -c 'print(1)'", "suspend": True, "rayClusterSpec": {"headGroupSpec": {
            "rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-head", "image": "none"}]}}}}},
    }  # fmt: skip
    testbed.apply(foreign, namespace=namespace)
    start_controller()
    testbed.apply(training_run("reborn", tmp_path, max_steps=10), namespace=namespace)

    status = wait_status(
        testbed,
        namespace,
        "reborn",
        "waiting for the old RayJob",
        lambda s: "belongs to another" in s.get("message", ""),
        60,
    )
    assert status.get("phase") != "Succeeded"
    assert not status.get("attempts"), "no attempt is recorded while the name is taken"

    testbed.kubectl("delete", "configmap", "old-run", "-n", namespace)  # the old run is gone: GC takes its RayJob
    run_uid = get(testbed, "trainingrun", "reborn", namespace)["metadata"]["uid"]

    def ours() -> bool:
        try:
            job = get(testbed, "rayjob", "reborn-a1", namespace)
        except subprocess.CalledProcessError:
            return False
        return [ref["uid"] for ref in job["metadata"].get("ownerReferences", [])] == [run_uid]

    tb.wait_until("attempt 1's own RayJob", ours, timeout=120)
    status = wait_status(testbed, namespace, "reborn", "attempt 1", lambda s: s.get("attempt") == 1, 60)
    assert [a["rayJob"] for a in status["attempts"]] == ["reborn-a1"]


def test_idle_active_runs_are_refreshed_at_the_set_rate_and_cost_no_writes(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """Issue #17: with runs active and nothing changing, the controller only reads, at its refresh rate.

    16 runs whose Ray clusters never start (their workers ask for more CPU than any node has: each
    waits for capacity, issue 71), an interval of 1 s but 4 refreshes a second: each run is looked at
    every 4 s, not every second, and no status patch, Event or Secret read is made while nothing
    changes. Counted in the API server's audit log: the controller runs as its own ServiceAccount.
    """
    kubeconfig, account = testbed.namespace_admin_kubeconfig(namespace, "controller", tmp_path / "sa.kubeconfig")
    start_controller(kubeconfig, SPOTRAY_REFRESHES_PER_SECOND="4")
    test_started = time.time()
    names = [f"idle-{index:02d}" for index in range(16)]
    documents = []
    for name in names:
        document = training_run(name, tmp_path, max_steps=10)
        document["spec"]["workers"]["cpu"] = "500"  # pending for ever: nothing about the run changes
        documents.append(document)
    testbed.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(documents))

    def all_refreshed() -> bool:
        found = json.loads(testbed.kubectl("get", "trainingruns", "-n", namespace, "-o", "json").stdout)["items"]
        return len(found) == len(names) and all(
            "waiting for capacity" in (item.get("status") or {}).get("message", "") for item in found
        )

    tb.wait_until("every run's first refresh", all_refreshed, timeout=90, interval=1)
    time.sleep(2)  # the last refresh's requests are logged
    started = time.time()
    time.sleep(12)
    ended = time.time()
    kinds = testbed.request_counts(account, started, ended)
    print(f"requests in {ended - started:.1f} s: {dict(kinds)}")
    writes = {
        kind: count for kind, count in kinds.items() if kind.split()[0] in ("create", "patch", "update", "delete")
    }
    assert writes == {}, "nothing changed, so nothing may be written"
    assert kinds["get secrets"] == 0
    # One GET of the run per refresh: 16 runs every 4 s is 48 in 12 s (at most 4 a second, plus a
    # burst of 4); with the plain 1 s interval it would be 192.
    assert 30 <= kinds["get trainingruns"] <= 4 * 12 + 4
    # From the start: one RayJob create per run, whether the burst made the controller defer the status
    # writes or not (a deferred write must not create the RayJob again); one status write when the
    # attempt starts and one when its wait for capacity begins, unless the first already said so.
    whole = testbed.request_counts(account, test_started, time.time())
    assert whole["create rayjobs"] == len(names)
    assert len(names) <= whole["patch trainingruns/status"] <= 2 * len(names)


ELASTIC_RUN_STEPS = 600


def progress_of(s3_server: LocalS3Server, manifest: dict[str, Any]) -> Any:
    """The attempt's own progress object in S3 (train/records/progress_log.py): its newest worker group's size."""
    store = S3ObjectStore(parse_uri(manifest["spec"]["checkpoint"]["uri"]), s3_server.config, RetryPolicy())
    attempts = read_run_progress(store)
    return attempts[-1] if attempts else None


# About 4 minutes: a campaign (make test-campaign). tests/integration/test_elastic.py (in make test)
# proves the same shrinking and growing through `spotray run --local`, sample by sample.
@pytest.mark.campaign
def test_an_elastic_run_outlives_a_lost_spot_node_in_one_attempt_and_grows_back_when_it_returns(
    testbed: tb.Testbed,
    namespace: str,
    s3_secret: str,
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],
    tmp_path: Path,
) -> None:
    """Two worker pods on two kwok spot nodes, ``minReplicas: 1``; the attempt's RayCluster is bridged to a
    Ray head of one CPU and a Ray worker node of one CPU, so one training worker lives on each. One spot
    node is preempted (its pods disrupted and deleted) and, with it, the Ray node that stood for it is
    SIGKILLed: the run goes on with one worker in the same attempt, no budget spent. The node returns
    (kwok node and Ray node): the run grows back to two workers and succeeds, still attempt 1."""
    start_controller()
    manifest = training_run("elastic", tmp_path, max_steps=ELASTIC_RUN_STEPS)
    manifest["spec"]["workers"] = {"replicas": 2, "minReplicas": 1, "cpu": "1", "memory": "2Gi"}
    pod_env = {**s3_server.env(), "PYTHONPATH": str(ROOT), "SPOTRAY_ELASTIC_RESIZE_CHECK_S": "5"}
    with tb.RayHead(tmp_path / "ray", num_cpus=1, extra_env=pod_env) as head:
        worker_node = head.add_worker_node(num_cpus=1)
        testbed.apply(manifest, namespace=namespace)
        testbed.bridge_ray_job(namespace, "elastic-a1", head.address, timeout=120)
        wait_status(testbed, namespace, "elastic", "a complete checkpoint", lambda s: "lastCheckpoint" in s, 600)
        assert progress_of(s3_server, manifest).world_size == 2
        job = get(testbed, "rayjob", "elastic-a1", namespace)
        assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"] == 1
        pods = json.loads(
            testbed.kubectl("get", "pods", "-n", namespace, "-l", "spotray.dev/attempt=1", "-o", "json").stdout
        )["items"]
        spot_node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker")

        testbed.preempt_node(spot_node)  # the cloud takes the VM: its pod is disrupted and gone
        worker_node.kill()  # ... and the Ray node on it, without a word
        try:
            shrunk = tb.wait_until(
                "the run to go on with one worker",
                lambda: (p := progress_of(s3_server, manifest)) is not None and p.world_size == 1 and p,
                timeout=240,
                interval=2,
            )
            status = get(testbed, "trainingrun", "elastic", namespace)["status"]
            assert (status["attempt"], status["preemptions"], status["failures"]) == (1, 0, 0), status
        finally:
            testbed.restore_node(spot_node)
        head.add_worker_node(num_cpus=1)  # capacity returns
        grown = tb.wait_until(
            "the run to grow back to two workers",
            lambda: (p := progress_of(s3_server, manifest)) is not None and p.world_size == 2 and p,
            timeout=240,
            interval=2,
        )
        assert len(grown.restarts) >= len(shrunk.restarts) + 1
        status = wait_status(testbed, namespace, "elastic", "Succeeded", finished, 600)

    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["preemptions"], status["failures"]) == (1, 0, 0), "one attempt, no budget"
    assert status["goodput"]["workerRestarts"] >= 2, status["goodput"]
    assert status["lastCheckpoint"]["step"] == ELASTIC_RUN_STEPS
    annotations = get(testbed, "rayjob", "elastic-a1", namespace)["metadata"].get("annotations") or {}
    assert spot_node in annotations.get("spotray.dev/disruption", ""), "the controller saw the loss, and went on"
    assert rayjobs(testbed, namespace, "elastic") == ["elastic-a1"]
