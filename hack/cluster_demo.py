"""`make cluster-demo`: the cluster story in one command, on a machine without Docker.

What a person does on a real cluster, on the Docker-free test bed (docs/testbed.md): the chart
installed with helm (CRDs, RBAC, the controller's ServiceAccount), an S3 server and the run's
Secret, the GPT-2 TrainingRun applied with kubectl, its progress followed with `spotray watch`, a
spot node deleted mid-run, the next attempt resuming from the newest checkpoint, Succeeded, then
`spotray pull` and `spotray plot`.

What stands in for what (the test bed runs no containers; see docs/testbed.md):
- the RayJob's pods are scheduled on kwok nodes, and the Ray cluster they would form is one real
  `ray start --head` on loopback, reached through the test bed's bridge. That head is started with
  the environment a pod of the run gets from the Secret the TrainingRun names (read back from the
  API server, as the kubelet would), plus the project on PYTHONPATH (the image's WORKDIR);
- the controller runs as a process with the Deployment's settings and a token of the chart's
  ServiceAccount (its own rights, nothing more), in HTTPMode (no submitter pod);
- a lost spot node is what the cloud does: its pods marked DisruptionTarget, then the node and pods
  deleted; the Ray job that ran "on" them is stopped, since the shared head outlives the kwok node.

The demo is the test bed's supervisor while it runs (its pid in <dir>/supervisor.pid), so
`make cluster-down` from another terminal stops it and everything it started, the S3 server
included. With --keep it stays up after the run, to poke at, until then (or Ctrl-C).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "testbed"))
import testbed as tb  # the test bed's module lives next to this script

from spotray.contract.names import ATTEMPT_LABEL, RUN_LABEL, SUCCEEDED, TERMINAL_PHASES
from spotray.train.storage.local_s3 import LocalS3Server

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "spotray"
RELEASE = "spotray"
SYSTEM_NAMESPACE = "spotray-system"
NAMESPACE = "spotray-demo"
SECRET = "spotray-demo-s3"  # noqa: S105 (the Secret's name; its keys are the S3 server's own)
BUCKET = "spotray"
RUN = "gpt2-demo"
MAX_STEPS = 200
CHECKPOINT_EVERY = 20
PREEMPT_AT_STEP = 50  # seen in status a few seconds late (status is refreshed every 2 s): mid-run all the same
RUN_TIMEOUT_S = 900


class StopRequestedError(Exception):
    """SIGTERM (make cluster-down) or Ctrl-C: stop everything."""


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def demo_training_run(
    job_dir: Path, name: str = RUN, steps: int = MAX_STEPS, every: int = CHECKPOINT_EVERY, max_preemptions: int = 3
) -> dict[str, Any]:
    """jobs/gpt2/trainingrun.yaml, made to fit the demo: one CPU worker on a spot node, its own Secret."""
    document = yaml.safe_load((ROOT / "jobs" / "gpt2" / "trainingrun.yaml").read_text())
    document["metadata"] = {"name": name, "namespace": NAMESPACE}
    spec = document["spec"]
    spec["entrypoint"] = f"python -m spotray.jobs.gpt2 --max-steps {steps} --batch-size 8 --workdir {job_dir}"
    spec["workers"] = {"replicas": 1, "cpu": "1", "memory": "2Gi"}
    spec["checkpoint"] = {
        "uri": f"s3://{BUCKET}/runs/{name}",
        "everySteps": every,
        "keep": 3,
        "secretRef": SECRET,
    }
    spec["data"] = {"uri": f"s3://{BUCKET}/datasets/gpt2-bytes"}
    spec["retry"] = {"maxPreemptions": max_preemptions, "maxFailures": 1, "backoffSeconds": 1}
    return document


def secret_env(testbed: tb.Testbed, namespace: str, name: str) -> dict[str, str]:
    """The environment a pod gets from the Secret by envFrom: its keys and decoded values."""
    secret = json.loads(testbed.kubectl("get", "secret", name, "-n", namespace, "-o", "json").stdout)
    return {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}


def run_status(testbed: tb.Testbed, name: str = RUN) -> dict[str, Any]:
    found = testbed.kubectl("get", "trainingrun", name, "-n", NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
    return status


def start_controller(testbed: tb.Testbed, workdir: Path) -> subprocess.Popen[bytes]:
    """`python -m spotray.controller` with the chart's Deployment settings and ServiceAccount."""
    deployment = json.loads(
        testbed.kubectl("get", "deployment", f"{RELEASE}-controller", "-n", SYSTEM_NAMESPACE, "-o", "json").stdout
    )
    pod = deployment["spec"]["template"]["spec"]
    chart_env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    kubeconfig = testbed.service_account_kubeconfig(
        SYSTEM_NAMESPACE, pod["serviceAccountName"], workdir / "controller.kubeconfig"
    )
    health_port, metrics_port = tb.free_ports(2)
    env = {
        **os.environ,
        **chart_env,
        "KUBECONFIG": str(kubeconfig),
        "SPOTRAY_SUBMISSION_MODE": "HTTPMode",  # kwok runs no submitter pod
        "SPOTRAY_HEALTH_PORT": str(health_port),
        "SPOTRAY_METRICS_PORT": str(metrics_port),
        "SPOTRAY_RECONCILE_INTERVAL_SECONDS": "2",
    }
    log = (workdir / "controller.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "spotray.controller"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def lose_the_spot_node(testbed: tb.Testbed, ray: tb.RayHead, stop: threading.Event) -> None:
    """Once attempt 1 passed PREEMPT_AT_STEP: delete the node of its worker pod, as a cloud reclaims it."""
    while not stop.is_set():
        status = run_status(testbed)
        step = (status.get("progress") or {}).get("step") or 0
        if status.get("phase") in TERMINAL_PHASES:
            return
        if len(status.get("attempts") or []) == 1 and step >= PREEMPT_AT_STEP:
            break
        time.sleep(1)
    else:
        return
    reclaim_worker_node(testbed, ray, status, RUN, stop)


def reclaim_worker_node(
    testbed: tb.Testbed, ray: tb.RayHead, status: dict[str, Any], name: str, stop: threading.Event
) -> None:
    """Delete the node of the current attempt's worker pod, as a cloud reclaims a spot VM; it comes back 10 s later."""
    attempt = len(status.get("attempts") or [])
    step = (status.get("progress") or {}).get("step")
    selector = f"{RUN_LABEL}={name},{ATTEMPT_LABEL}={attempt},ray.io/node-type=worker"
    pods = json.loads(testbed.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout)["items"]
    node = pods[0]["spec"]["nodeName"]
    job = json.loads(testbed.kubectl("get", "rayjob", status["rayJob"], "-n", NAMESPACE, "-o", "json").stdout)
    say(f"spot node {node} reclaimed at step {step} (its pods marked DisruptionTarget, node and pods deleted)")
    testbed.preempt_node(node)
    ray.kill_job(job["status"]["jobId"])  # the shared Ray head outlives the kwok node: stop its job to match
    stop.wait(10)
    testbed.restore_node(node)  # a new spot VM joins under the same name


def spotray(*args: str, kubeconfig: Path | None = None, env: dict[str, str] | None = None) -> int:
    """The spotray command line, as a person would type it (printed first)."""
    command = [sys.executable, "-m", "spotray.cli", *args]
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    print(f"$ spotray {' '.join(args)}", flush=True)
    try:
        return subprocess.run(command, env={**os.environ, **(env or {})}, check=False, timeout=RUN_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"spotray {args[0]} still running after {RUN_TIMEOUT_S} s: gave up", flush=True)
        return 124


@contextlib.contextmanager
def as_supervisor(workdir: Path) -> Iterator[None]:
    """Be the test bed's supervisor (make cluster-down signals it); SIGTERM and Ctrl-C raise StopRequestedError."""
    pid_file = workdir / "supervisor.pid"
    if pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists():
        sys.exit(f"a test bed is already running in {workdir}: make cluster-down first")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    pid_file.write_text(str(os.getpid()))

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise StopRequestedError(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pid_file.unlink(missing_ok=True)


@dataclass
class DemoCluster:
    """What `demo_cluster` starts: the test bed with the chart installed, S3, the Ray head, the controller."""

    testbed: tb.Testbed
    s3: LocalS3Server
    ray: tb.RayHead
    kubeconfig: Path


@contextlib.contextmanager
def demo_cluster(workdir: Path) -> Iterator[DemoCluster]:
    """The test bed, an S3 server, `helm install` of the chart, the run's Secret, a Ray head with what
    its pods would get, and the controller; all stopped on the way out."""
    with contextlib.ExitStack() as stack:
        say(f"starting the test bed in {workdir} (etcd, kube-apiserver, scheduler, kwok nodes, KubeRay)")
        testbed = stack.enter_context(tb.Testbed(workdir))
        kubeconfig = testbed.kubeconfig
        print(
            "while it runs, from another terminal:\n"
            f"  export KUBECONFIG={kubeconfig}\n"
            f"  kubectl get trainingruns -n {NAMESPACE} -w\n"
            f"  kubectl get events -n {NAMESPACE} --sort-by=.lastTimestamp\n"
            f"  kubectl get rayjobs,pods -n {NAMESPACE} -o wide\n"
            "  make cluster-down    # stops everything this demo started",
            flush=True,
        )

        say("an S3 server (SeaweedFS) for checkpoints and the dataset")
        s3 = stack.enter_context(LocalS3Server(workdir / "s3"))
        s3.create_bucket(BUCKET)

        say(f"helm install {RELEASE} charts/spotray (CRDs, RBAC, the controller) watching {NAMESPACE}")
        testbed.kubectl("create", "namespace", NAMESPACE)
        testbed.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        helm = [str(tb.binary("helm")), "--kubeconfig", str(kubeconfig)]
        subprocess.run([*helm, "install", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE, "--create-namespace", "--wait",
                        "--set", f"controller.watchNamespaces={{{NAMESPACE}}}", "--set", f"s3.existingSecret={SECRET}",
                        "--set-json", f"s3.allowedEndpoints={json.dumps([s3.endpoint_url])}"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip

        say(f"the run's S3 Secret {SECRET} (endpoint and keys), and a Ray head with what its pods would get")
        literals = [f"--from-literal={key}={value}" for key, value in s3.env().items()]
        testbed.kubectl("create", "secret", "generic", SECRET, "-n", NAMESPACE, *literals)
        pod_env = {**secret_env(testbed, NAMESPACE, SECRET), "PYTHONPATH": str(ROOT)}
        ray = stack.enter_context(tb.RayHead(workdir / "ray", num_cpus=3, extra_env=pod_env))
        testbed.set_default_ray_head(ray.address)

        say("the controller, with the chart's settings and ServiceAccount")
        controller = start_controller(testbed, workdir)
        stack.callback(controller.wait)
        stack.callback(controller.terminate)
        yield DemoCluster(testbed, s3, ray, kubeconfig)


def demo(workdir: Path, keep: bool) -> int:
    with demo_cluster(workdir) as cluster, contextlib.ExitStack() as stack:
        testbed, kubeconfig = cluster.testbed, cluster.kubeconfig
        manifest = workdir / "trainingrun.yaml"
        manifest.write_text(yaml.safe_dump(demo_training_run(workdir / "job"), sort_keys=False))
        say(f"kubectl apply -f {manifest}")
        print(testbed.kubectl("apply", "-f", str(manifest)).stdout.strip(), flush=True)

        stop = threading.Event()
        stack.callback(stop.set)
        threading.Thread(target=lose_the_spot_node, args=(testbed, cluster.ray, stop), daemon=True).start()
        say(f"spotray watch {RUN} (a spot node is lost after step {PREEMPT_AT_STEP})")
        spotray("watch", RUN, "-n", NAMESPACE, kubeconfig=kubeconfig)
        status = run_status(testbed)
        print(testbed.kubectl("get", "trainingrun", RUN, "-n", NAMESPACE).stdout, flush=True)
        for attempt in status.get("attempts") or []:
            print(f"  attempt {attempt['attempt']}: {attempt['outcome']} ({attempt.get('reason', '')})")
        if status.get("phase") != SUCCEEDED:
            say(f"the run ended {status.get('phase')}: {status.get('message')}; logs in {workdir}")
            return 1

        say("the final model and the loss across attempts, from S3")
        env = cluster.s3.env()
        if spotray("pull", str(manifest), str(workdir / "model"), env=env) != 0:
            return 1
        if spotray("plot", str(manifest), "-o", str(workdir / "loss.png"), env=env) != 0:
            return 1
        if keep:
            say(f"kept up: export KUBECONFIG={kubeconfig}; `make cluster-down` (or Ctrl-C) stops it all")
            while True:
                time.sleep(3600)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=tb.DEFAULT_DIR, help="work directory (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up after the run (make cluster-down)")
    args = parser.parse_args()
    with as_supervisor(args.dir):
        try:
            return demo(args.dir.resolve(), args.keep)
        except StopRequestedError as why:
            print(f"\nstopped ({why}): stopping everything the demo started", flush=True)
            return 130


if __name__ == "__main__":
    sys.exit(main())
