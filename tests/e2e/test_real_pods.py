"""The cluster story on real pods (testbed/cluster_demo.py's cluster): real kubelets, containerd and runc
run the images built from the repository's Dockerfile, on a pod network in 198.18.0.0/15 with no
uplink (docs/testbed.md, "Real pods").

`helm install` of the chart starts the controller Deployment and MinIO as real containers; a
TrainingRun trains in the KubeRay RayCluster's head and worker pods; its spot node is reclaimed the
way a cloud does it (the notice: taint and eviction with the pods' grace period, so the preStop drain
and the emergency checkpoint run in the container; then the VM: kubelet, containers and network
stop, the Node is deleted); a new spot node joins, the next attempt resumes from the newest
checkpoint, the run ends Succeeded, and `spotray pull` verifies the model from MinIO. All of it with
Ray's token auth on (the chart's default): the head's dashboard refuses a caller without the
cluster's token, and `spotray logs` reads the driver's log through a port-forward only with it. And
with NetworkPolicies enforced on the nodes (kube-network-policies): a pod of another namespace
reaches neither the run's Ray ports nor MinIO, while the run trains and checkpoints through it all.
Afterwards nothing of the nodes is left on the machine and its kernel settings are as before.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV
from spotray.contract.names import (
    RUN_LABEL,
    SPOT_LABEL,
    SPOT_LABEL_ON_DEMAND,
    SPOT_LABEL_SPOT,
    SUCCEEDED,
    TERMINAL_PHASES,
)
from spotray.contract.status import parse_timestamp
from spotray.train.storage.local_s3 import free_port
from testbed import cluster_demo
from testbed.kueue import Kueue
from tests.e2e.conftest import ROOT, tb
from tests.integration.test_own_script import readme_own_script

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

real = tb.real
RUN = "gpt2-real"
MAX_STEPS = 300
EVERY = 25
RECLAIM_AT_STEP = 60
# Paced: unpaced, the run once went from step 100 (the reclaim, after the checks below) to 300 before
# the worker's preStop drain landed, and attempt 1 simply succeeded (CI of 92b88a7).
STEP_S = 0.2
TIMEOUT_S = 1200
TOKEN = "s3cr3t-run-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster_demo.DemoCluster]:
    # The images must hold this tree's code: images.sh --check says whether they are current.
    if subprocess.run([str(ROOT / "testbed" / "images.sh"), "--check"], check=False).returncode != 0:
        pytest.fail("the test bed's images are missing or older than the sources: run `make testbed`")
    before = real.kernel_settings()
    with cluster_demo.demo_cluster(tmp_path_factory.mktemp("real-pods")) as demo:
        yield demo
    # The machine as it was: no namespace, link, cgroup or mount of the nodes, same kernel settings.
    assert real.kernel_settings() == before
    assert real.leftover_netns() == []
    assert real.leftover_links() == []
    assert real.leftover_cgroups() == []
    assert real.leftover_mounts() == []


# The first test's time includes the module's cluster: on a cold cache each node imports the 4 GB
# image (up to 20 minutes: Testbed.wait_real_nodes_ready), then helm install.
@pytest.mark.timeout(1800)
def test_the_chart_runs_its_controller_and_minio_as_real_pods(cluster: cluster_demo.DemoCluster) -> None:
    bed = cluster.testbed
    for component in ("controller", "minio"):
        (pod,) = cluster_demo.pods(bed, cluster_demo.SYSTEM_NAMESPACE, f"app.kubernetes.io/component={component}")
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["podIP"].startswith("198.18."), pod["status"]
        assert all(c["ready"] for c in pod["status"]["containerStatuses"]), pod["status"]
    # kubectl logs and exec reach the real containers through the kubelets.
    controller = ["-n", cluster_demo.SYSTEM_NAMESPACE, "deployment/spotray-controller"]
    assert bed.kubectl("logs", *controller).stdout.strip(), "the controller container logged nothing"
    # The controller's own image (the Dockerfile's controller target): spotray, kopf, optuna; no torch, no Ray.
    probe = (
        "import importlib.util as u, spotray.controller, kopf, optuna; "
        "print('in the pod', [m for m in ('torch', 'ray', 'transformers') if u.find_spec(m)])"
    )
    assert "in the pod []" in bed.kubectl("exec", *controller, "--", "python", "-c", probe).stdout


def progress(status: dict[str, Any]) -> str:
    attempts = [f"{a['attempt']}:{a.get('outcome')}" for a in status.get("attempts") or []]
    return f"{status.get('phase')} step {(status.get('progress') or {}).get('step')} attempts {attempts}"


def check_secret_env(bed: tb.Testbed) -> None:
    """The head and the worker of attempt 1 hold the Secret's value; the RayJob only the reference."""
    for node_type in ("head", "worker"):
        selector = f"{RUN_LABEL}={RUN},ray.io/node-type={node_type}"
        [pod] = cluster_demo.pods(bed, cluster_demo.NAMESPACE, selector)
        printed = bed.kubectl(
            "exec", "-n", cluster_demo.NAMESPACE, pod["metadata"]["name"], "--", "printenv", "RUN_TOKEN"
        )
        assert printed.stdout.strip() == TOKEN, (node_type, printed.stdout, printed.stderr)
    rayjob = bed.kubectl("get", "rayjob", f"{RUN}-a1", "-n", cluster_demo.NAMESPACE, "-o", "yaml").stdout
    assert TOKEN not in rayjob
    assert "secretKeyRef" in rayjob


# Run in the head's Ray container: its own dashboard, asked for the job list without a token, with a
# wrong one and with the one KubeRay gave the container.
DASHBOARD_ASKS = """
import os, urllib.error, urllib.request
def ask(token):
    request = urllib.request.Request("http://127.0.0.1:8265/api/jobs/")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code
print(ask(None), ask("not-the-token"), ask(os.environ["RAY_AUTH_TOKEN"]))
"""


def check_ray_token_auth(bed: tb.Testbed) -> None:
    """Issue #38, item 2: Ray's token auth is on in attempt 1's cluster (KubeRay's authOptions, the
    chart's default): the dashboard refuses a caller without the cluster's token, and the run's own
    parts (workers joining the GCS, the submitter, the preStop drain later) hold it."""
    [head] = cluster_demo.pods(bed, cluster_demo.NAMESPACE, f"{RUN_LABEL}={RUN},ray.io/node-type=head")
    env = {e["name"]: e for e in head["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token", env
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "auth_token", env
    name = head["metadata"]["name"]
    asked = bed.kubectl("exec", "-n", cluster_demo.NAMESPACE, name, "--", "python", "-c", DASHBOARD_ASKS)
    assert asked.stdout.split() == ["401", "403", "200"], asked.stdout + asked.stderr


# Run in a pod: a TCP connection to each host:port given, 3 s at most; prints "open", "timeout" or the error.
CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "open")
    except TimeoutError:
        print(target, "timeout")
    except OSError as error:
        print(target, type(error).__name__)
"""


def connections(bed: tb.Testbed, namespace: str, pod: str, *targets: str) -> dict[str, str]:
    asked = bed.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", CONNECT, *targets)
    return dict(line.split(" ", 1) for line in asked.stdout.splitlines())


def intruder_pod(namespace: str) -> dict[str, Any]:
    """A pod of the project's image in a namespace of its own, with nothing of the run's."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": real.images_manifest()["spotray"]["ref"],
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "infinity"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        },
    }


def check_network_policies_hold(bed: tb.Testbed) -> None:
    """Issue #38, item 3: the nodes enforce NetworkPolicies (kube-network-policies), and the run's
    own policy and MinIO's hold. From another namespace a pod reaches neither the head's dashboard
    nor its GCS, by pod address or through the head's Service, nor MinIO's S3 port (so no job and
    no checkpoint of the run's); it does reach the API server, so what stops it is the policy. The
    run's worker reaches its head and MinIO but not the API server (the run's egress), and the run
    trains on, under enforcement, to the end."""
    namespace = "intruder"
    bed.kubectl("create", "namespace", namespace)
    bed.apply(intruder_pod(namespace))
    bed.kubectl("wait", "--for=condition=Ready", "pod/intruder", "-n", namespace, "--timeout=120s")
    [head] = cluster_demo.pods(bed, cluster_demo.NAMESPACE, f"{RUN_LABEL}={RUN},ray.io/node-type=head")
    [worker] = cluster_demo.pods(bed, cluster_demo.NAMESPACE, f"{RUN_LABEL}={RUN},ray.io/node-type=worker")
    [minio] = cluster_demo.pods(bed, cluster_demo.SYSTEM_NAMESPACE, "app.kubernetes.io/component=minio")
    rayjob = json.loads(bed.kubectl("get", "rayjob", f"{RUN}-a1", "-n", cluster_demo.NAMESPACE, "-o", "json").stdout)
    # The cluster's head Service, by name (KubeRay makes it headless: the name is the head pod's address).
    head_service = f"{rayjob['status']['rayClusterName']}-head-svc.{cluster_demo.NAMESPACE}.svc.cluster.local"
    head_ip, minio_ip = head["status"]["podIP"], minio["status"]["podIP"]
    guarded = [f"{head_ip}:8265", f"{head_ip}:6379", f"{head_service}:8265", f"{minio_ip}:9000"]
    api_server = f"{real.HOST_IP}:{bed.api_port}"
    seen = connections(bed, namespace, "intruder", *guarded, api_server)
    assert seen == {**dict.fromkeys(guarded, "timeout"), api_server: "open"}, seen
    # The run's pods reach their own and MinIO, and (egress limited, the chart's default) not the API server.
    wanted = [f"{head_ip}:8265", f"{head_ip}:6379", f"{minio_ip}:9000"]
    own = connections(bed, cluster_demo.NAMESPACE, worker["metadata"]["name"], *wanted, api_server)
    assert own == {**dict.fromkeys(wanted, "open"), api_server: "timeout"}, own
    bed.kubectl("delete", "namespace", namespace, "--wait=false")


def check_logs_need_the_token(bed: tb.Testbed, spotray: Any, attempt: int) -> str:
    """`spotray logs --dashboard` through a port-forward to the attempt's head: refused without the token
    (the error names the Secret that holds it), the driver's log with the token read from that Secret,
    which it returns."""
    rayjob = json.loads(
        bed.kubectl("get", "rayjob", f"{RUN}-a{attempt}", "-n", cluster_demo.NAMESPACE, "-o", "json").stdout
    )
    cluster_name = rayjob["status"]["rayClusterName"]
    port = free_port()
    forward = subprocess.Popen(
        [
            str(tb.binary("kubectl")),
            "--kubeconfig",
            str(bed.kubeconfig),
            "port-forward",
            "-n",
            cluster_demo.NAMESPACE,
            f"svc/{cluster_name}-head-svc",
            f"{port}:8265",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert forward.stdout is not None
        started = forward.stdout.readline()
        assert "Forwarding from" in started, f"kubectl port-forward did not start: {started}"
        dashboard = [
            "logs",
            RUN,
            "-n",
            cluster_demo.NAMESPACE,
            "--attempt",
            str(attempt),
            "--dashboard",
            f"http://127.0.0.1:{port}",
        ]
        refused = spotray(*dashboard, env={"RAY_AUTH_TOKEN": ""})
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "RAY_AUTH_TOKEN is not set" in refused.stderr, refused.stderr
        assert f"kubectl get secret {cluster_name} -n {cluster_demo.NAMESPACE}" in refused.stderr, refused.stderr
        secret = json.loads(
            bed.kubectl("get", "secret", cluster_name, "-n", cluster_demo.NAMESPACE, "-o", "json").stdout
        )
        assert secret["metadata"]["ownerReferences"][0]["kind"] == "RayCluster", secret["metadata"]
        token = base64.b64decode(secret["data"]["auth_token"]).decode()
        logged = spotray(*dashboard, env={"RAY_AUTH_TOKEN": token})
        assert logged.returncode == 0, logged.stdout + logged.stderr
        assert logged.stdout.strip(), "the driver's log came back empty"
        return str(logged.stdout)
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def check_logs_through_the_api_server(spotray: Any, driver_log: str) -> None:
    """`spotray logs` and `logs -f` with no port-forward and no token: the attempt's submitter pod's log,
    read through the API server and its kubelet, holds the driver's log as Ray's jobs API gave it."""
    last_line = driver_log.strip().splitlines()[-1]
    for follow in ([], ["-f"]):  # the run has ended: -f prints the log to its end and returns
        logged = spotray("logs", RUN, "-n", cluster_demo.NAMESPACE, *follow, env={"RAY_AUTH_TOKEN": ""})
        assert logged.returncode == 0, logged.stdout + logged.stderr
        assert last_line in logged.stdout, f"{last_line!r} not in:\n{logged.stdout[-3000:]}"
        assert "spotray.submitter: job" in logged.stdout, logged.stdout[:2000]  # the submitter pod's own lines


@pytest.mark.timeout(TIMEOUT_S + 300)
def test_a_training_run_on_real_pods_survives_a_spot_reclaim(cluster: cluster_demo.DemoCluster, tmp_path: Path) -> None:
    bed = cluster.testbed
    manifest = tmp_path / "trainingrun.yaml"
    document = cluster_demo.demo_training_run(name=RUN, steps=MAX_STEPS, every=EVERY, min_step_seconds=STEP_S)
    # A Secret's key as the job's variable (spec.secretEnv): the kubelet puts it in the containers.
    secret = ["secret", "generic", "run-token", "-n", cluster_demo.NAMESPACE, f"--from-literal=token={TOKEN}"]
    bed.kubectl("create", *secret)
    document["spec"]["secretEnv"] = {"RUN_TOKEN": "run-token/token"}
    manifest.write_text(yaml.safe_dump(document))
    bed.kubectl("apply", "-f", str(manifest))

    deadline = time.monotonic() + TIMEOUT_S
    while (
        step := ((status := cluster_demo.run_status(bed, RUN)).get("progress") or {}).get("step") or 0
    ) < RECLAIM_AT_STEP:
        assert status.get("phase") not in TERMINAL_PHASES, json.dumps(status, indent=2)
        assert time.monotonic() < deadline, f"no step {RECLAIM_AT_STEP} in time: {status}"
        print(progress(status), flush=True)
        time.sleep(2)
    check_secret_env(bed)
    check_ray_token_auth(bed)
    check_network_policies_hold(bed)
    status = cluster_demo.run_status(bed, RUN)
    assert status.get("phase") not in TERMINAL_PHASES, f"the run ended before its reclaim: {progress(status)}"
    cluster_demo.reclaim_worker_node(bed, status, RUN, threading.Event())
    while (status := cluster_demo.run_status(bed, RUN)).get("phase") not in TERMINAL_PHASES:
        if time.monotonic() > deadline:
            print(cluster_demo.diagnose(bed), flush=True)
            pytest.fail(f"the run did not end in time: {status}")
        print(progress(status), flush=True)
        time.sleep(3)
    attempts = status.get("attempts") or []
    assert status["phase"] == SUCCEEDED, json.dumps(status, indent=2)
    assert attempts[0]["outcome"] == "Preempted", attempts
    assert status.get("failures", 0) == 0, attempts
    # Attempt 2 resumed from the emergency checkpoint of attempt 1, and the status says where it ended.
    assert attempts[1]["resumedFrom"] == int(attempts[0]["message"].rsplit("step ", 1)[1]), attempts
    assert status["progress"]["step"] == status["progress"]["totalSteps"] == MAX_STEPS
    assert status["lastCheckpoint"]["uri"].endswith(f"/{RUN}/checkpoint-{MAX_STEPS}"), status["lastCheckpoint"]
    for attempt in attempts:  # where each start-up went, from real pods' Ready times and the job's clock
        startup = attempt["startup"]
        print(f"attempt {attempt['attempt']} start-up: {startup}", flush=True)
        assert 0 < startup["podsReady"] <= startup["trainingLoop"] <= startup["firstStep"], attempt
    about_the_run = f"involvedObject.name={RUN}"
    events = bed.kubectl("get", "events", "-n", cluster_demo.NAMESPACE, "--field-selector", about_the_run)
    for reason in ("AttemptStarted", "SpotNotice", "Succeeded"):
        assert reason in events.stdout, events.stdout
    # The preempted attempt's RayJob (and so its cluster) was deleted once judged.
    rayjobs = bed.kubectl("get", "rayjobs", "-n", cluster_demo.NAMESPACE, "-o", "name").stdout.split()
    assert rayjobs == [f"rayjob.ray.io/{RUN}-a2"], rayjobs

    # The goodput ledger adds up to the wall time, in the status, kubectl's table and `spotray status`.
    goodput = status["goodput"]
    assert 0 < goodput["ratio"] <= 1, goodput
    accounted = goodput["survivingStepSeconds"] + sum(goodput["lostSeconds"].values())
    assert accounted == pytest.approx(goodput["wallSeconds"], abs=4), goodput  # each part in whole seconds
    assert "GOODPUT" in bed.kubectl("get", "trainingruns", "-n", cluster_demo.NAMESPACE).stdout.splitlines()[0]

    def spotray(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **cluster.s3_env, "KUBECONFIG": str(bed.kubeconfig), **(env or {})}
        command = [sys.executable, "-m", "spotray.cli", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)

    detail = spotray("status", RUN, "-n", cluster_demo.NAMESPACE)
    assert "Phase:           Succeeded" in detail.stdout, detail.stdout + detail.stderr
    assert "Goodput:         " in detail.stdout, detail.stdout
    assert "START-UP" in detail.stdout, detail.stdout  # the attempts' start-up, in seconds
    assert spotray("watch", RUN, "-n", cluster_demo.NAMESPACE).returncode == 0  # an ended run: at once
    pulled = spotray("pull", str(manifest), str(tmp_path / "model"))
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert (tmp_path / "model" / "model.safetensors").exists()
    # The jobs signed every checkpoint with the run's key, which the controller made and the kubelet
    # gave the pods (attempt 2 resumed from a signed one: a keyed resume takes nothing else).
    assert f"signature was NOT checked: {CHECKPOINT_KEY_ENV} is not set" in pulled.stdout, pulled.stdout

    def get(kind: str, name: str) -> dict[str, Any]:
        return json.loads(bed.kubectl("get", kind, name, "-n", cluster_demo.NAMESPACE, "-o", "json").stdout)  # type: ignore[no-any-return]

    key_secret = get("secret", "spotray-checkpoint-key")
    assert "ownerReferences" not in key_secret["metadata"]
    key = base64.b64decode(key_secret["data"]["key"]).decode()
    checked = spotray("pull", str(manifest), str(tmp_path / "checked"), env={CHECKPOINT_KEY_ENV: key})
    assert "signed with the run's key" in checked.stdout, checked.stdout + checked.stderr
    wrong = spotray("pull", str(manifest), str(tmp_path / "wrong"), env={CHECKPOINT_KEY_ENV: "w" * 64})
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "does not match the run's key" in wrong.stderr, wrong.stderr
    check_logs_through_the_api_server(spotray, check_logs_need_the_token(bed, spotray, attempt=2))
    plotted = spotray("plot", RUN, "-n", cluster_demo.NAMESPACE, "--output", str(tmp_path / "loss.png"))
    assert plotted.returncode == 0, plotted.stdout + plotted.stderr
    assert step >= RECLAIM_AT_STEP


KEPT_RUN = "gpt2-kept"
KEPT_STEPS = 200


# In make test-campaign: 140 s alone, 255 s in a CI run, which it took over make test's budget (39 min
# 40 s); the kept cluster's decisions are in make test as unit tests (tests/unit/test_ray_cluster_per_run.py).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_a_run_on_its_own_kept_ray_cluster_goes_on_after_a_worker_reclaim_on_the_same_head(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """controller.rayClusterPerRun on real pods: the reclaim takes the spot worker, KubeRay replaces it
    on the new spot node, and attempt 2 runs on the same RayCluster with the same head pod; the run's
    cluster is deleted when it ends. Prints notice -> attempt 2's first step (the head kept)."""
    bed = cluster.testbed
    cluster_demo.set_ray_cluster_per_run(bed, on=True)
    document = cluster_demo.demo_training_run(name=KEPT_RUN, steps=KEPT_STEPS, every=EVERY, min_step_seconds=STEP_S)
    manifest = tmp_path / "kept.yaml"
    manifest.write_text(yaml.safe_dump(document))
    bed.kubectl("apply", "-f", str(manifest))
    ray_cluster = f"{KEPT_RUN}-c1"
    head_selector = f"ray.io/cluster={ray_cluster},ray.io/node-type=head"

    deadline = time.monotonic() + TIMEOUT_S
    while ((status := cluster_demo.run_status(bed, KEPT_RUN)).get("progress") or {}).get("step", 0) < 40:
        assert status.get("phase") not in TERMINAL_PHASES, json.dumps(status, indent=2)
        assert time.monotonic() < deadline, f"no step 40 in time: {status}"
        time.sleep(2)
    assert status["attempts"][0]["rayCluster"] == ray_cluster, status["attempts"]
    head_uid = cluster_demo.pods(bed, cluster_demo.NAMESPACE, head_selector)[0]["metadata"]["uid"]
    noticed = cluster_demo.reclaim_worker_node(bed, status, KEPT_RUN, threading.Event())
    heads_seen = set()
    while (status := cluster_demo.run_status(bed, KEPT_RUN)).get("phase") not in TERMINAL_PHASES:
        if time.monotonic() > deadline:
            print(cluster_demo.diagnose(bed), flush=True)
            pytest.fail(f"the run did not end in time: {status}")
        heads_seen |= {pod["metadata"]["uid"] for pod in cluster_demo.pods(bed, cluster_demo.NAMESPACE, head_selector)}
        print(progress(status), flush=True)
        time.sleep(2)
    attempts = status.get("attempts") or []
    assert status["phase"] == SUCCEEDED, json.dumps(status, indent=2)
    assert [a["outcome"] for a in attempts] == ["Preempted", "Succeeded"], attempts
    assert [a["rayCluster"] for a in attempts] == [ray_cluster, ray_cluster], "the head was kept: one cluster"
    assert heads_seen == {head_uid}, "attempt 2 ran on the same head pod"
    assert status["progress"]["step"] == KEPT_STEPS
    second = attempts[1]
    started = parse_timestamp(second["startTime"])
    assert started is not None, second
    training_again = started.timestamp() + second["startup"]["firstStep"]
    print(
        f"head kept: notice -> attempt 2's first step {training_again - noticed:.1f} s "
        f"(the spot node back after {cluster_demo.SPOT_BACK_AFTER_S} s); attempt 2 start-up {second['startup']}",
        flush=True,
    )

    # Deleted once the run ended (KubeRay's finalizer may still be removing its pods), and the last
    # RayJob with it: its submitter, still following the driver's log when Ray said SUCCEEDED, would
    # otherwise retry into pods that cannot start (the cluster's token Secret goes with the cluster).
    def going(kind: str, name: str) -> bool:
        found = bed.kubectl("get", kind, name, "-n", cluster_demo.NAMESPACE, "-o", "json", check=False)
        return found.returncode != 0 or "deletionTimestamp" in json.loads(found.stdout)["metadata"]

    for kind, name in (("rayjob", f"{KEPT_RUN}-a2"), ("raycluster", ray_cluster)):
        # The controller writes the status before it deletes (controller/reconcile.py).
        tb.wait_until(f"{kind} {name} deleted after the run ended", lambda k=kind, n=name: going(k, n), timeout=30)


SUSPENDED_RUN = "gpt2-suspend"
SUSPEND_AT_STEP = 40
# Periodic checkpoints only at steps 100 and 200, and 0.5 s a step: a resume from a step past the
# suspend that is no multiple of 100 can only be from the suspend's emergency checkpoint.
SUSPEND_EVERY, SUSPEND_STEP_S = 100, 0.5


# In make test-campaign: each mode runs real training to a suspend and its resume (about 4 minutes).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 300)
@pytest.mark.parametrize("kept", [False, True], ids=["rayjobs-own-cluster", "kept-cluster"])
def test_a_suspend_takes_an_emergency_checkpoint_and_the_resume_goes_on_from_it(
    cluster: cluster_demo.DemoCluster, tmp_path: Path, kept: bool
) -> None:
    """Issue #69, item 3: `spec.suspend: true` is an emergency checkpoint, then a stop, in both cluster
    modes. On a kept cluster, deleting the RayJob first stopped the driver at once and its workers with
    it, so the resume went back to the last periodic checkpoint (here: none, step 0). The resume must
    start at the step the suspend was seen at or later."""
    bed = cluster.testbed
    cluster_demo.set_ray_cluster_per_run(bed, on=kept)
    name = f"{SUSPENDED_RUN}-{'kept' if kept else 'own'}"
    document = cluster_demo.demo_training_run(
        name=name, steps=MAX_STEPS, every=SUSPEND_EVERY, min_step_seconds=SUSPEND_STEP_S
    )
    manifest = tmp_path / "suspended.yaml"
    manifest.write_text(yaml.safe_dump(document))
    bed.kubectl("apply", "-f", str(manifest))
    deadline = time.monotonic() + TIMEOUT_S
    while ((status := cluster_demo.run_status(bed, name)).get("progress") or {}).get("step", 0) < SUSPEND_AT_STEP:
        assert status.get("phase") not in TERMINAL_PHASES, json.dumps(status, indent=2)
        assert time.monotonic() < deadline, f"no step {SUSPEND_AT_STEP} in time: {status}"
        time.sleep(1)
    seen_at = status["progress"]["step"]
    bed.kubectl(
        "patch", "trainingrun", name, "-n", cluster_demo.NAMESPACE, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    print(f"suspended at step {seen_at} or later ({'kept cluster' if kept else 'the RayJob own cluster'})", flush=True)

    def stopped() -> bool:
        left = bed.kubectl(
            "get", "rayjobs,rayclusters", "-n", cluster_demo.NAMESPACE, "-l", f"{RUN_LABEL}={name}", "-o", "name"
        )
        return cluster_demo.run_status(bed, name).get("phase") == "Suspended" and not left.stdout.strip()

    tb.wait_until(f"{name} suspended, its RayJob and cluster gone", stopped, timeout=300)
    bed.kubectl(
        "patch", "trainingrun", name, "-n", cluster_demo.NAMESPACE, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )

    def resumed() -> dict[str, Any] | None:
        attempts = cluster_demo.run_status(bed, name).get("attempts") or []
        return attempts[1] if len(attempts) > 1 and attempts[1].get("resumedFrom") is not None else None

    tb.wait_until(f"{name}'s attempt 2 resumed", lambda: resumed() is not None, timeout=600)
    second = resumed()
    assert second is not None
    assert second["resumedFrom"] >= seen_at, (second, seen_at, cluster_demo.run_status(bed, name)["attempts"][0])
    assert second["resumedFrom"] % EVERY != 0 or second["resumedFrom"] > seen_at, (
        "an emergency checkpoint, not a periodic one"
    )
    print(f"suspend seen at step {seen_at}: attempt 2 resumed from step {second['resumedFrom']}", flush=True)
    bed.kubectl("delete", "trainingrun", name, "-n", cluster_demo.NAMESPACE)
    cluster_demo.set_ray_cluster_per_run(bed, on=False)


RECREATED_RUN = "gpt2-recreated"


def wait_for_checkpoint(bed: tb.Testbed, name: str, step: int, attempt: int | None = None) -> dict[str, Any]:
    """The run's status once its last complete checkpoint is at ``step`` or later (made by ``attempt``, when
    given); fails if the run ends first or after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        status = cluster_demo.run_status(bed, name)
        made = ((status.get("lastCheckpoint") or {}).get("step") or 0) >= step
        if made and attempt in (None, status.get("attempt")):
            return status
        assert status.get("phase") not in TERMINAL_PHASES, json.dumps(status, indent=2)
        assert time.monotonic() < deadline, f"no checkpoint-{step} in time: {status}"
        time.sleep(1)


def wait_until_ended(bed: tb.Testbed, name: str) -> dict[str, Any]:
    """The run's status once its phase is terminal (at most TIMEOUT_S)."""
    status: dict[str, Any] = tb.wait_until(
        f"{name} ended",
        lambda: (s := cluster_demo.run_status(bed, name)).get("phase") in TERMINAL_PHASES and s,
        timeout=TIMEOUT_S,
        interval=2,
    )
    return status


# In make test-campaign: one run to step 60, deleted, and created again until it resumes (about 3 minutes).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_a_run_deleted_and_created_again_resumes_from_its_checkpoints(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """Issue #69, reproduced here before the fix: `kubectl delete trainingrun` and `kubectl apply` of the same
    file made a new key Secret under the old name; the new pods got the kubelet's cached old value or the new
    one, so the run resumed by accident, or trained from step 0 over the first run's checkpoints. Now the key
    is the namespace's, kept when the run goes: the new run (another UID) resumes from the newest."""
    bed = cluster.testbed
    cluster_demo.set_ray_cluster_per_run(bed, on=False)
    document = cluster_demo.demo_training_run(name=RECREATED_RUN, steps=MAX_STEPS, every=EVERY, min_step_seconds=STEP_S)
    manifest = tmp_path / "recreated.yaml"
    manifest.write_text(yaml.safe_dump(document))
    bed.kubectl("apply", "-f", str(manifest))

    def get(kind: str, name: str) -> dict[str, Any]:
        return json.loads(bed.kubectl("get", kind, name, "-n", cluster_demo.NAMESPACE, "-o", "json").stdout)  # type: ignore[no-any-return]

    wait_for_checkpoint(bed, RECREATED_RUN, 2 * EVERY)
    first_uid = get("trainingrun", RECREATED_RUN)["metadata"]["uid"]
    key_uid = get("secret", "spotray-checkpoint-key")["metadata"]["uid"]
    bed.kubectl("delete", "trainingrun", RECREATED_RUN, "-n", cluster_demo.NAMESPACE, "--wait=true")
    tb.wait_until(
        "the first run's pods gone",
        lambda: not cluster_demo.pods(bed, cluster_demo.NAMESPACE, f"{RUN_LABEL}={RECREATED_RUN}"),
        timeout=300,
    )
    bed.kubectl("apply", "-f", str(manifest))

    def started() -> dict[str, Any] | None:
        """Attempt 1 of the new run, once it said where it started (or trained a step: a fresh start)."""
        status = cluster_demo.run_status(bed, RECREATED_RUN)
        attempts = status.get("attempts") or []
        if attempts and (attempts[0].get("resumedFrom") is not None or (status.get("progress") or {}).get("step")):
            return attempts[0]  # type: ignore[no-any-return]
        return None

    tb.wait_until("the new run's attempt 1 started training", lambda: started() is not None, timeout=600)
    first = started()
    assert first is not None
    assert get("trainingrun", RECREATED_RUN)["metadata"]["uid"] != first_uid, "another run"
    assert get("secret", "spotray-checkpoint-key")["metadata"]["uid"] == key_uid, "the same key Secret, never replaced"
    assert (first.get("resumedFrom") or 0) >= 2 * EVERY, first
    print(f"created again: attempt 1 resumed from step {first['resumedFrom']}", flush=True)
    bed.kubectl("delete", "trainingrun", RECREATED_RUN, "-n", cluster_demo.NAMESPACE)


QUEUED_RUN, WAITING_RUN = "gpt2-queued", "gpt2-waiting"
# Memory is what the queue counts here: one demo run asks about 7 GiB (a 4 GiB head, a 3 GiB worker),
# so 10 GiB hold one run and not two, and the competing Job asks all of it.
QUEUE_MEMORY = "10Gi"


def competing_job(namespace: str, queue: str, priority_class: str) -> dict[str, Any]:
    """A batch Job in the run's queue with a higher WorkloadPriorityClass, asking the whole quota."""
    container = {**intruder_pod(namespace)["spec"]["containers"][0], "command": ["sleep", "300"]}
    container["resources"] = {"requests": {"cpu": "100m", "memory": QUEUE_MEMORY}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "urgent",
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/priority-class": priority_class},
        },
        "spec": {
            "suspend": True,  # what Kueue's webhook would set; Kueue unsuspends it on admission
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                }
            },
        },
    }


# In make test-campaign: two runs through one queue, one evicted and resumed (about 6 minutes). The kwok
# smoke (tests/e2e/test_kueue.py) holds the queued wait in make test.
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 600)
def test_kueue_queues_a_second_run_and_an_eviction_is_a_preemption_that_resumes(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """Issue #71, item 5, on real pods with the real Kueue manager: a ClusterQueue that holds one run. The
    second run waits "queued" spending no budget; a higher-priority Job makes Kueue evict the running one,
    which counts a preemption (QueueEvicted) and resumes from its checkpoint once the Job is gone; the
    second run is admitted when the first ends."""
    bed = cluster.testbed
    namespace = cluster_demo.NAMESPACE
    cluster_demo.set_ray_cluster_per_run(bed, on=False)
    kueue = Kueue(bed).start()
    kueue.priority_class("e2e-low", 100)
    kueue.priority_class("e2e-high", 1000)
    kueue.cluster_queue("e2e-real-pods", cpu="16", memory=QUEUE_MEMORY)
    kueue.local_queue(namespace, "team", "e2e-real-pods")

    def apply_run(name: str, priority_class: str | None) -> None:
        document = cluster_demo.demo_training_run(name=name, steps=MAX_STEPS, every=EVERY, min_step_seconds=STEP_S)
        document["spec"]["queue"] = {"name": "team", **({"priorityClass": priority_class} if priority_class else {})}
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(yaml.safe_dump(document))
        bed.kubectl("apply", "-f", str(manifest))

    def status_of(name: str) -> dict[str, Any]:
        return cluster_demo.run_status(bed, name)

    try:
        apply_run(QUEUED_RUN, "e2e-low")
        tb.wait_until(f"{QUEUED_RUN} running", lambda: status_of(QUEUED_RUN).get("phase") == "Running", timeout=600)
        apply_run(WAITING_RUN, None)  # priority 0: behind the first run's next attempt too
        tb.wait_until(
            f"{WAITING_RUN} queued", lambda: "queued" in status_of(WAITING_RUN).get("message", ""), timeout=120
        )

        wait_for_checkpoint(bed, QUEUED_RUN, EVERY)
        bed.apply(competing_job(namespace, "team", "e2e-high"))
        tb.wait_until(f"{QUEUED_RUN}'s attempt 2", lambda: status_of(QUEUED_RUN).get("attempt") == 2, timeout=300)
        evicted = status_of(QUEUED_RUN)
        first = evicted["attempts"][0]
        assert (first["outcome"], first["reason"]) == ("Preempted", "QueueEvicted"), first
        assert (evicted.get("preemptions"), evicted.get("failures", 0)) == (1, 0), evicted
        waiting = status_of(WAITING_RUN)
        assert "queued" in waiting["message"], waiting
        assert waiting.get("failures", 0) == 0, waiting

        bed.kubectl("delete", "job", "urgent", "-n", namespace, "--cascade=foreground", "--timeout=120s")
        final = wait_until_ended(bed, QUEUED_RUN)
        assert final["phase"] == SUCCEEDED, json.dumps(final, indent=2)
        second = final["attempts"][1]
        assert (second.get("resumedFrom") or 0) >= EVERY, second
        assert (final.get("preemptions"), final.get("failures", 0)) == (1, 0), final
        print(f"attempt 1 evicted by Kueue ({first['reason']}): attempt 2 resumed from step {second['resumedFrom']}")

        tb.wait_until(
            f"{WAITING_RUN} admitted once the first ended",
            lambda: (s := status_of(WAITING_RUN)).get("phase") == "Running" or s.get("progress"),
            timeout=600,
        )
        waited = status_of(WAITING_RUN)
        assert (waited.get("failures", 0), waited.get("preemptions", 0), waited["attempt"]) == (0, 0, 1), waited
    finally:
        for name in (QUEUED_RUN, WAITING_RUN):
            bed.kubectl("delete", "trainingrun", name, "-n", namespace, "--wait=true", check=False)
        bed.kubectl("delete", "job", "urgent", "-n", namespace, check=False)
        bed.kubectl("delete", "localqueue", "team", "-n", namespace, check=False)
        bed.kubectl("delete", "clusterqueue", "e2e-real-pods", check=False)


FALLBACK_RUN = "gpt2-fallback"
FALLBACK_AFTER_S = 30


def evict(bed: tb.Testbed, namespace: str, pod: str) -> None:
    """Evict ``pod`` through the Eviction API, as a node drain for maintenance does (DisruptionTarget set,
    its grace period and preStop hook honoured)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    bed.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-",
                stdin=json.dumps(eviction))  # fmt: skip


# In make test-campaign: three attempts of real training (about 6 minutes). On kwok, tests/e2e/test_capacity.py
# holds the fall back in make test.
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 600)
def test_a_run_without_spot_nodes_falls_back_to_on_demand_and_returns_to_spot_at_its_next_attempt(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """Issue #71, item 6, on real pods: the spot node is taken away; a spot-then-on-demand run waits
    spending nothing, falls back to the on-demand node after fallback.afterWaitSeconds and trains there. A
    spot node comes back; the on-demand worker is evicted (a drain for maintenance): the next attempt
    resumes on spot. No failure is spent, and status.cost shows both phases."""
    bed = cluster.testbed
    namespace = cluster_demo.NAMESPACE
    spot = cluster_demo.SPOT_NODE
    cluster_demo.set_ray_cluster_per_run(bed, on=False)
    cluster_demo.set_chart_values(
        bed, "controller.prices.currency=USD", "controller.prices.spotPerHour=1", "controller.prices.onDemandPerHour=3"
    )
    bed.reclaim_real_node(spot.name)
    document = cluster_demo.demo_training_run(name=FALLBACK_RUN, steps=MAX_STEPS, every=EVERY, min_step_seconds=STEP_S)
    document["spec"]["workers"]["capacity"] = "spot-then-on-demand"
    document["spec"]["workers"]["fallback"] = {"afterWaitSeconds": FALLBACK_AFTER_S}
    manifest = tmp_path / "fallback.yaml"
    manifest.write_text(yaml.safe_dump(document))

    def status() -> dict[str, Any]:
        return cluster_demo.run_status(bed, FALLBACK_RUN)

    def workers(attempt: int) -> list[dict[str, Any]]:
        selector = f"{RUN_LABEL}={FALLBACK_RUN},spotray.dev/attempt={attempt},ray.io/node-type=worker"
        return cluster_demo.pods(bed, namespace, selector)

    def worker_nodes(attempt: int) -> set[str]:
        return {p["spec"].get("nodeName") for p in workers(attempt)} - {None}

    try:
        bed.kubectl("apply", "-f", str(manifest))
        waiting = tb.wait_until(
            "attempt 1 waiting for capacity",
            lambda: s if "waiting for capacity" in (s := status()).get("message", "") else None,
            timeout=300,
        )
        assert waiting["attempts"][0]["capacity"] == "spot", waiting
        tb.wait_until(f"{FALLBACK_RUN}'s attempt 2", lambda: status().get("attempt") == 2, timeout=300)
        wait_for_checkpoint(bed, FALLBACK_RUN, EVERY, attempt=2)
        assert worker_nodes(2) == {cluster_demo.ON_DEMAND_NODE.name}, worker_nodes(2)

        bed.start_real_node(spot)  # spot capacity is back
        bed.wait_real_nodes_ready([spot.name])
        evict(bed, namespace, workers(2)[0]["metadata"]["name"])
        tb.wait_until(f"{FALLBACK_RUN}'s attempt 3", lambda: status().get("attempt") == 3, timeout=300)
        final = wait_until_ended(bed, FALLBACK_RUN)
        assert final["phase"] == SUCCEEDED, json.dumps(final, indent=2)
        assert [a.get("capacity") for a in final["attempts"]] == ["spot", "on-demand", "spot"], final["attempts"]
        assert final["attempts"][0]["reason"] == "CapacityFallback", final["attempts"][0]
        assert worker_nodes(3) <= {spot.name}, worker_nodes(3)
        assert (final["attempts"][2].get("resumedFrom") or 0) >= EVERY, final["attempts"][2]
        assert final.get("failures", 0) == 0, final
        assert final["cost"]["onDemandSeconds"] > 0, final["cost"]
        print(f"attempts: {[(a.get('capacity'), a.get('reason')) for a in final['attempts']]}; cost {final['cost']}")
    finally:
        bed.kubectl("delete", "trainingrun", FALLBACK_RUN, "-n", namespace, "--wait=true", check=False)
        if f"node-{spot.name}" not in bed.procs:
            bed.start_real_node(spot)
            bed.wait_real_nodes_ready([spot.name])


# What each cloud puts on its nodes (charts/spotray/templates/_helpers.tpl, spotray.capacityPresets; and
# docs/deploy.md, section 7): the on-demand node's labels, the spot node's labels, and the spot node's taint.
PROVIDER_NODES: dict[str, tuple[dict[str, str], dict[str, str], str | None]] = {
    "karpenter": ({"karpenter.sh/capacity-type": "on-demand"}, {"karpenter.sh/capacity-type": "spot"}, None),
    "gke": ({}, {"cloud.google.com/gke-spot": "true"}, "cloud.google.com/gke-spot=true:NoSchedule"),
    "eks": ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, {"eks.amazonaws.com/capacityType": "SPOT"}, None),
    "aks": (
        {},
        {"kubernetes.azure.com/scalesetpriority": "spot"},
        "kubernetes.azure.com/scalesetpriority=spot:NoSchedule",
    ),
}
SPOTRAY_TAINT = f"{tb.SPOT_TAINT['key']}={tb.SPOT_TAINT['value']}:{tb.SPOT_TAINT['effect']}"


def relabel(
    bed: tb.Testbed,
    node: str,
    add: dict[str, str],
    remove: list[str],
    *,
    taint: str | None = None,
    untaint: str | None = None,
) -> None:
    """Give ``node`` the labels ``add``, take ``remove`` off, and swap its taint ``untaint`` for ``taint``."""
    bed.kubectl("label", "node", node, "--overwrite", *(f"{k}={v}" for k, v in add.items()), *(f"{k}-" for k in remove))
    if untaint:
        bed.kubectl("taint", "node", node, f"{untaint}-", check=False)
    if taint:
        bed.kubectl("taint", "node", node, taint, "--overwrite")


# In make test-campaign: one short training per provider (about 3 minutes each). The presets' rendering is
# in make test (tests/integration/test_chart.py).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("provider", sorted(PROVIDER_NODES))
def test_a_cloud_presets_values_file_places_a_run_on_nodes_labelled_as_that_cloud_does(
    cluster: cluster_demo.DemoCluster, tmp_path: Path, provider: str
) -> None:
    """Issue #71, item 4, on real pods: the nodes carry only the labels and taints ``provider`` gives its
    on-demand and spot nodes (none of the project's own), the chart is upgraded with
    charts/spotray/examples/<provider>.yaml as a user would install it (its ServiceAccount made, as the file
    says), and a run trains to Succeeded with its head on the on-demand node and its worker on the spot one."""
    bed = cluster.testbed
    namespace = cluster_demo.NAMESPACE
    on_demand, spot = cluster_demo.ON_DEMAND_NODE.name, cluster_demo.SPOT_NODE.name
    on_demand_labels, spot_labels, spot_taint = PROVIDER_NODES[provider]
    values = ROOT / "charts" / "spotray" / "examples" / f"{provider}.yaml"
    account = yaml.safe_load(values.read_text())["ray"]["serviceAccountName"]
    name = f"gpt2-{provider}"
    before = tmp_path / "values-before.yaml"  # the user-supplied values, put back afterwards
    before.write_text(cluster_demo.chart_values(bed))
    relabel(bed, on_demand, on_demand_labels, [SPOT_LABEL])
    relabel(bed, spot, spot_labels, [SPOT_LABEL], taint=spot_taint, untaint=SPOTRAY_TAINT)
    try:
        bed.kubectl("create", "serviceaccount", account, "-n", namespace)
        cluster_demo.upgrade_chart(bed, "--reuse-values", "-f", str(values))
        document = cluster_demo.demo_training_run(name=name, steps=EVERY, every=EVERY)
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(yaml.safe_dump(document))
        bed.kubectl("apply", "-f", str(manifest))
        placed: dict[str, dict[str, Any]] = {}  # node type -> pod spec, seen while the run's pods are there
        deadline = time.monotonic() + TIMEOUT_S - 120
        while (final := cluster_demo.run_status(bed, name)).get("phase") not in TERMINAL_PHASES:
            assert time.monotonic() < deadline, cluster_demo.diagnose(bed) + json.dumps(final, indent=2)
            for pod in cluster_demo.pods(bed, namespace, f"{RUN_LABEL}={name}"):
                node_type = pod["metadata"]["labels"].get("ray.io/node-type")
                if node_type and pod["spec"].get("nodeName"):
                    placed[node_type] = pod["spec"]
            time.sleep(2)
        assert final["phase"] == SUCCEEDED, json.dumps(final, indent=2)
        assert placed["head"]["nodeName"] == on_demand, placed["head"]
        assert placed["worker"]["nodeName"] == spot, placed["worker"]
        assert placed["worker"]["serviceAccountName"] == account, placed["worker"]
        print(f"{provider}: head on {on_demand}, worker on {spot}, Succeeded at step {final['progress']['step']}")
    finally:
        bed.kubectl("delete", "trainingrun", name, "-n", namespace, "--wait=true", check=False)
        bed.kubectl("delete", "serviceaccount", account, "-n", namespace, check=False)
        relabel(bed, on_demand, {SPOT_LABEL: SPOT_LABEL_ON_DEMAND}, list(on_demand_labels))
        relabel(bed, spot, {SPOT_LABEL: SPOT_LABEL_SPOT}, list(spot_labels), taint=SPOTRAY_TAINT, untaint=spot_taint)
        cluster_demo.upgrade_chart(bed, "--reset-values", "-f", str(before))


SHARED_CLAIM = "team-share"


def shared_volume_objects(export: Path, namespace: str) -> list[dict[str, Any]]:
    """A claim named SHARED_CLAIM in ``namespace``, bound to a hostPath PV of ``export``: the test bed's
    stand-in for an NFS export (this kernel has no NFS client; the nodes share the machine's disk), made
    as a user makes the claim that ``sharedStorage.existingClaim`` names."""
    volume = f"testbed-share-{namespace}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(export), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": SHARED_CLAIM},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": SHARED_CLAIM, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


def attempt_said(bed: tb.Testbed, name: str, words: str) -> dict[str, Any]:
    """The run's status once its first attempt ended with ``words`` in its message (at most TIMEOUT_S)."""

    def ended() -> dict[str, Any] | None:
        status = cluster_demo.run_status(bed, name)
        first = (status.get("attempts") or [{}])[0]
        return status if first.get("endTime") and words in json.dumps(status) else None

    found: dict[str, Any] = tb.wait_until(f"{name}'s attempt 1 ended saying {words!r}", ended, timeout=TIMEOUT_S)
    return found


# In make test-campaign: one hook refused, one run without the claim, one run to step 25 (about 6 minutes).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_the_shared_volumes_hook_makes_a_root_owned_export_writable_by_the_ray_user(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """Issue #71, item 3, on real pods: the chart's shared volume (``sharedStorage.existingClaim``) is a
    root-owned directory, as an NFS export is before anyone touches it, which fsGroup does not change.

    - In the release namespace as the test bed makes it (Pod Security ``restricted``), the permission
      hook's root pod is refused and the upgrade fails; the Job's events say why (docs/security.md).
    - With the namespace at ``baseline``, the hook owns the export to uid/gid 1000, mode 2775.
    - A run in a namespace without the claim ends its attempt at the start deadline in the scheduler's
      words, not waiting for capacity (controller/pod_waits.py).
    - With the claim there, a run checkpoints to ``file:///mnt/shared/...`` as the Ray user and the
      controller reads its checkpoints through its read-only mount (``controller.fileRoots``)."""
    bed = cluster.testbed
    system, namespace = cluster_demo.SYSTEM_NAMESPACE, cluster_demo.NAMESPACE
    export = bed.workdir / "shared-export"
    export.mkdir(mode=0o755)
    assert (export.stat().st_uid, export.stat().st_mode & 0o7777) == (0, 0o755), "root's, as an export starts"
    before = tmp_path / "values-before.yaml"
    before.write_text(cluster_demo.chart_values(bed))
    shared = ["--reuse-values", "--set", "sharedStorage.enabled=true",
              "--set", f"sharedStorage.existingClaim={SHARED_CLAIM}", "--set", "controller.fileRoots={/mnt/shared}",
              "--set", "controller.startDeadlineSeconds=120"]  # fmt: skip
    missing, written = "gpt2-no-claim", "gpt2-shared"
    bed.apply(*shared_volume_objects(export, system))
    try:
        refused = subprocess.run([*cluster_demo.helm(bed), "upgrade", cluster_demo.RELEASE, str(cluster_demo.CHART),
                                  "-n", system, *shared, "--wait", "--timeout", "60s"],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        assert refused.returncode != 0, "a root pod in a restricted namespace"
        events = bed.kubectl("get", "events", "-n", system, "--field-selector", "involvedObject.kind=Job").stdout
        assert "violates PodSecurity" in events, events
        assert export.stat().st_uid == 0, "nothing changed the export"

        bed.kubectl("label", "namespace", system, "pod-security.kubernetes.io/enforce=baseline", "--overwrite")
        cluster_demo.upgrade_chart(bed, *shared)
        mode = export.stat()
        assert (mode.st_uid, mode.st_gid, mode.st_mode & 0o7777) == (1000, 1000, 0o2775), oct(mode.st_mode)

        def shared_run(name: str) -> Path:
            # A file:// checkpoint directory must exist (the job refuses one that does not: the volume
            # may not be mounted), owned by the Ray user as its own mkdir would leave it. (Made here as
            # root and given away: uid 1000 cannot reach the export through pytest's 0700 tmp dirs.)
            directory = export / "runs" / name
            directory.mkdir(parents=True)
            for made in (directory.parent, directory):
                os.chown(made, 1000, 1000)
            document = cluster_demo.demo_training_run(name=name, steps=EVERY, every=EVERY)
            document["spec"]["checkpoint"]["uri"] = f"file:///mnt/shared/runs/{name}"
            manifest = tmp_path / f"{name}.yaml"
            manifest.write_text(yaml.safe_dump(document))
            bed.kubectl("apply", "-f", str(manifest))
            return directory

        # The run's namespace has no claim of that name yet: stuck, in the scheduler's words.
        shared_run(missing)
        status = attempt_said(bed, missing, f'persistentvolumeclaim \\"{SHARED_CLAIM}\\" not found')
        assert status["attempts"][0]["reason"] == "StartDeadlineExceeded", json.dumps(status, indent=2)
        assert not status["attempts"][0].get("capacityWaitSince"), "no capacity wait"
        bed.kubectl("delete", "trainingrun", missing, "-n", namespace, "--wait=true")

        bed.apply(*shared_volume_objects(export, namespace))
        checkpoints = shared_run(written)
        final = wait_until_ended(bed, written)
        assert final["phase"] == SUCCEEDED, cluster_demo.diagnose(bed) + json.dumps(final, indent=2)
        assert final["lastCheckpoint"]["step"] == EVERY, "read by the controller through its read-only mount"
        files = [p for p in checkpoints.rglob("*") if p.is_file()]
        assert files, f"nothing written under {checkpoints}"
        assert {p.stat().st_uid for p in files} == {1000}, "written by the Ray user"
        print(f"shared volume: {len(files)} files of {written} written by uid 1000; checkpoint {EVERY} read")
    finally:
        for name in (missing, written):
            bed.kubectl("delete", "trainingrun", name, "-n", namespace, "--wait=true", check=False)
        bed.kubectl("label", "namespace", system, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
        cluster_demo.upgrade_chart(bed, "--reset-values", "-f", str(before))
        for ns in (system, namespace):
            bed.kubectl("delete", "pvc", SHARED_CLAIM, "-n", ns, "--wait=true", check=False)
            bed.kubectl("delete", "pv", f"testbed-share-{ns}", "--wait=true", check=False)


OWN_RUN = "own-script"


# In make test-campaign: the README's own script, 20 steps on the head (about 3 minutes).
@pytest.mark.campaign
@pytest.mark.timeout(TIMEOUT_S)
def test_your_own_script_runs_on_the_cluster_from_a_zip_in_the_bucket(
    cluster: cluster_demo.DemoCluster, tmp_path: Path
) -> None:
    """Issue #72, item 6, on real pods: the README's own Hugging Face script (no spotray job module, no
    image of its own) zipped into the bucket and named by ``spec.runtimeEnv.working_dir``: Ray's runtime
    env agent fetches it with the pod's S3 settings, the entrypoint runs it, it checkpoints to the run's
    URI, and the controller reads those checkpoints (docs/job.md, "Your script on the cluster")."""
    bed = cluster.testbed
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("train.py", readme_own_script())
    env = cluster.s3_env
    s3 = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )
    s3.put_object(Bucket=cluster_demo.BUCKET, Key="code/own-script.zip", Body=archive.getvalue())
    document = cluster_demo.demo_training_run(name=OWN_RUN, steps=20, every=10)
    spec = document["spec"]
    spec["entrypoint"] = (
        f"python train.py --checkpoint-uri s3://{cluster_demo.BUCKET}/runs/{OWN_RUN} --max-steps 20 "
        "--save-steps 10 --workdir /home/ray/own"
    )
    spec["runtimeEnv"] = {"working_dir": f"s3://{cluster_demo.BUCKET}/code/own-script.zip"}
    manifest = tmp_path / f"{OWN_RUN}.yaml"
    manifest.write_text(yaml.safe_dump(document))
    bed.kubectl("apply", "-f", str(manifest))
    try:
        final = wait_until_ended(bed, OWN_RUN)
        assert final["phase"] == SUCCEEDED, cluster_demo.diagnose(bed) + json.dumps(final, indent=2)
        assert final["lastCheckpoint"]["step"] == 20, final["lastCheckpoint"]
        assert final["lastCheckpoint"]["uri"].endswith(f"/runs/{OWN_RUN}/checkpoint-20"), final["lastCheckpoint"]
    finally:
        bed.kubectl("delete", "trainingrun", OWN_RUN, "-n", cluster_demo.NAMESPACE, "--wait=true", check=False)
