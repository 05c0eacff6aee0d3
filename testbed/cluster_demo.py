"""`make cluster-demo`: the cluster story in one command, on real pods, on a machine without Docker.

What a person does on a real cluster, on the test bed's real nodes (docs/testbed.md, "Real pods"):
two real kubelets (one on-demand node, one spot node) run real containers with containerd, from
images built from this repository's Dockerfile. `helm install` of the chart starts the controller
Deployment and the in-cluster MinIO (the S3 store) as pods; the GPT-2 TrainingRun is applied with
kubectl and its progress followed with `spotray watch`; KubeRay's RayCluster head and worker pods
train it. Mid-run the spot node is reclaimed the way a cloud does it: the notice (a taint, and its
pods evicted with their grace period, so the worker's preStop drain and the emergency checkpoint
run in the container), then the VM goes (kubelet, containers and network stop, the Node is
deleted). A new spot node joins, the next attempt resumes from the newest checkpoint, the run ends
Succeeded, then `spotray pull` and `spotray plot` read the model and the loss from MinIO.

The demo is the test bed's supervisor while it runs (its pid in <dir>/supervisor.pid), so
`make cluster-down` from another terminal stops it and everything it started. With --keep it
stays up after the run, to poke at, until then (or Ctrl-C).
"""

from __future__ import annotations

import argparse
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

import testbed.cluster as tb
from spotray.contract.names import (
    ATTEMPT_LABEL,
    RUN_LABEL,
    SPOT_LABEL,
    SPOT_LABEL_ON_DEMAND,
    SPOT_LABEL_SPOT,
    SUCCEEDED,
    TERMINAL_PHASES,
)

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "spotray"
RELEASE = "spotray"
SYSTEM_NAMESPACE = "spotray-system"
NAMESPACE = "spotray-demo"
SECRET = "spotray-demo-s3"  # noqa: S105 - the Secret's name
# MinIO's root user, made up for this throwaway cluster (the chart takes it from s3.existingSecret).
ROOT_USER, ROOT_PASSWORD = "spotray-demo", "spotray-demo-password"
BUCKET = "spotray"
RUN = "gpt2-demo"
MAX_STEPS = 120
CHECKPOINT_EVERY = 20
PREEMPT_AT_STEP = 50  # seen in status a few seconds late (status is refreshed every 2 s): mid-run all the same
RUN_TIMEOUT_S = 1200
# The job's scratch directory inside the Ray pods: the image user's home (uid 1000 owns it).
POD_JOB_DIR = "/home/ray/job"
SPOT_BACK_AFTER_S = 5  # a new spot VM joins this long after the old one is gone
DEMO_MIN_STEP_SECONDS = 0.2  # the reclaim lands mid-run, not after the last step (see demo_training_run)

ON_DEMAND_NODE = tb.real.RealNode("real-ondemand-0", 1, labels={SPOT_LABEL: SPOT_LABEL_ON_DEMAND})


def spot_node(index: int) -> tb.real.RealNode:
    """The ``index``-th spot node (real-spot-0, real-spot-1, ...), after the on-demand node on the fabric."""
    return tb.real.RealNode(
        f"real-spot-{index}", 2 + index, labels={SPOT_LABEL: SPOT_LABEL_SPOT}, taints=[dict(tb.SPOT_TAINT)]
    )


SPOT_NODE = spot_node(0)


class StopRequestedError(BaseException):
    """SIGTERM (make cluster-down) or Ctrl-C: stop everything. Not an Exception, as KeyboardInterrupt is
    not: a wait that takes any Exception for "not yet" (testbed/cluster.py ``wait_until``) swallowed it,
    and `make cluster-down` or a Ctrl-C during one of the demo's waits went unheard until the wait ended."""


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def demo_training_run(
    job_dir: str = POD_JOB_DIR,
    name: str = RUN,
    steps: int = MAX_STEPS,
    every: int = CHECKPOINT_EVERY,
    max_preemptions: int = 3,
    *,
    min_step_seconds: float = 0.0,
    spares: int = 0,
) -> dict[str, Any]:
    """jobs/gpt2/trainingrun.yaml, made to fit two small nodes: one CPU worker on the spot node
    (and ``spares`` spare worker pods, each wanting a spot node of its own).

    ``min_step_seconds`` paces the tiny model like a real one: unpaced it runs 10 steps a second or
    more, faster than a spot notice takes effect (the preStop hook starts Python and drains the Ray
    node), so a run reclaimed with 200 steps to go could finish before its notice landed.
    """
    document = yaml.safe_load((ROOT / "jobs" / "gpt2" / "trainingrun.yaml").read_text())
    document["metadata"] = {"name": name, "namespace": NAMESPACE}
    spec = document["spec"]
    spec["entrypoint"] = f"python -m spotray.jobs.gpt2 --max-steps {steps} --batch-size 8 --workdir {job_dir}"
    if min_step_seconds:
        spec["entrypoint"] += f" --min-step-seconds {min_step_seconds:g}"
    # The head hosts the driver and Ray Train's controller actor besides Ray itself: about 2 GB in use,
    # which Ray's memory monitor would kill tasks over under a 2Gi limit.
    spec["head"] = {"cpu": "250m", "memory": "4Gi"}
    spec["workers"] = {"replicas": 1, "cpu": "500m", "memory": "3Gi"}
    if spares:
        spec["workers"]["spareReplicas"] = spares
    spec["checkpoint"] = {
        "uri": f"s3://{BUCKET}/runs/{name}",
        "everySteps": every,
        "keep": 3,
        "secretRef": SECRET,
    }
    spec["data"] = {"uri": f"s3://{BUCKET}/datasets/gpt2-bytes"}
    spec["retry"] = {"maxPreemptions": max_preemptions, "maxFailures": 1, "backoffSeconds": 1}
    return document


def run_status(testbed: tb.Testbed, name: str = RUN) -> dict[str, Any]:
    found = testbed.kubectl("get", "trainingrun", name, "-n", NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
    return status


def pods(testbed: tb.Testbed, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = testbed.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def delete_run(testbed: tb.Testbed, name: str, timeout_s: float = 300.0) -> None:
    """Delete the run and wait until its pods are gone (its RayJobs and clusters go with it, by owner
    references): KubeRay keeps a finished job's cluster for its TTL, and the next run needs the room."""
    testbed.kubectl("delete", "trainingrun", name, "-n", NAMESPACE, "--wait=false", check=False)
    tb.wait_until(
        f"the pods of run {name} gone",
        lambda: not pods(testbed, NAMESPACE, f"{RUN_LABEL}={name}"),
        timeout=timeout_s,
        interval=2,
    )


def lose_the_spot_node(testbed: tb.Testbed, stop: threading.Event) -> None:
    """Once attempt 1 passed PREEMPT_AT_STEP: reclaim the node of its worker pod, as a cloud does."""
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
    reclaim_worker_node(testbed, status, RUN, stop)


def worker_pods_selector(status: dict[str, Any], name: str, node_type: str = "worker") -> str:
    """The label selector of the current attempt's worker pods (``node_type`` head: its head pod): of
    its own Ray cluster, or of the run's kept across attempts (controller.rayClusterPerRun)."""
    attempts = status.get("attempts") or [{}]
    ray_cluster = attempts[-1].get("rayCluster")
    whose = f"ray.io/cluster={ray_cluster}" if ray_cluster else f"{ATTEMPT_LABEL}={len(attempts)}"
    return f"{RUN_LABEL}={name},{whose},ray.io/node-type={node_type}"


# Run in a worker pod: does it host the run's Ray Train worker? (Ray names an actor's process after
# its class; a spare's Ray node runs none.) Its own argv holds the class's name too: skipped.
EXEC_TIMEOUT_S = 15  # the probe takes about a second; an API server held by a fault does not answer
HOSTS_TRAIN_WORKER = """
import os, pathlib
def cmdline(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""
others = (p for p in pathlib.Path("/proc").glob("[0-9]*") if p.name != str(os.getpid()))
print(any(b"RayTrainWorker" in cmdline(p / "cmdline") for p in others))
"""


def training_worker_node(testbed: tb.Testbed, worker_pods: list[dict[str, Any]]) -> str | None:
    """The node of the worker pod that runs the run's Ray Train worker (not a spare's), asked of each
    pod's container; None when none answers that it does (a fault may hold the API server: each
    ask is bounded by EXEC_TIMEOUT_S)."""
    for pod in worker_pods:
        found = testbed.kubectl(
            f"--request-timeout={EXEC_TIMEOUT_S}s", "exec", "-n", NAMESPACE, pod["metadata"]["name"],
            "-c", "ray-worker", "--", "python", "-c", HOSTS_TRAIN_WORKER, check=False,
        )  # fmt: skip
        if found.returncode == 0 and found.stdout.strip() == "True" and pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"])
    return None


def reclaim_worker_node(
    testbed: tb.Testbed, status: dict[str, Any], name: str, stop: threading.Event, node: str | None = None
) -> float:
    """Reclaim ``node``, by default the node of the current attempt's (first) worker pod: the notice,
    then the VM gone; a new spot VM joins SPOT_BACK_AFTER_S later. Returns when the notice was given
    (time.time())."""
    step = (status.get("progress") or {}).get("step")
    node = node or pods(testbed, NAMESPACE, worker_pods_selector(status, name))[0]["spec"]["nodeName"]
    say(f"spot node {node} reclaimed at step {step}: tainted, its pods evicted with their grace period, then gone")
    noticed = time.time()
    testbed.reclaim_real_node(node)
    stop.wait(SPOT_BACK_AFTER_S)
    testbed.start_real_node(next(n for n in testbed.real_nodes if n.name == node))  # a new spot VM, same name
    testbed.wait_real_nodes_ready([node])
    return noticed


def diagnose(testbed: tb.Testbed, log_lines: int = 40) -> str:
    """What a person would look at when a run on the real nodes stalls: pods, recent events, the
    pods that are not ready, and the tail of each real node's kubelet and containerd logs."""
    parts = [
        testbed.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout,
        testbed.kubectl("get", "nodes", "-o", "wide", check=False).stdout,
        testbed.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-6000:],
    ]
    listed = testbed.kubectl("get", "pods", "-A", "-o", "json", check=False).stdout
    for pod in json.loads(listed)["items"] if listed else []:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if pod["status"].get("phase") != "Succeeded" and not (statuses and all(c.get("ready") for c in statuses)):
            meta = pod["metadata"]
            parts.append(testbed.kubectl("describe", "pod", "-n", meta["namespace"], meta["name"], check=False).stdout)
    for node in testbed.real_nodes:
        for log in ("kubelet", "containerd"):
            path = testbed.workdir / "nodes" / node.name / f"{log}.log"
            lines = path.read_text(errors="replace").splitlines()[-log_lines:] if path.exists() else ["(none)"]
            parts.append(f"--- {path} (last {log_lines} lines)\n" + "\n".join(lines))
    return "\n".join(parts)


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
    """What `demo_cluster` starts: the test bed on real nodes with the chart installed (controller, MinIO)."""

    testbed: tb.Testbed
    kubeconfig: Path
    s3_env: dict[str, str]  # MinIO's endpoint (its pod address) and root keys, for `spotray pull` from here


def minio_volume(testbed: tb.Testbed) -> dict[str, Any]:
    """A PersistentVolume for the chart's MinIO claim: a directory of the work dir (the nodes share the
    machine's disk). 0777: MinIO runs as a user that owns nothing here, and fsGroup skips hostPath."""
    path = testbed.workdir / "minio-data"
    path.mkdir(exist_ok=True)
    path.chmod(0o777)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "testbed-minio"},
        "spec": {
            "capacity": {"storage": "50Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


def image_values() -> list[str]:
    """helm --set flags that point the chart at the images `make testbed` built (never pulled)."""
    refs = {name: image["ref"].rsplit(":", 1) for name, image in tb.real.images_manifest().items()}
    return [
        "--set", f"image.repository={refs['spotray'][0]}", "--set", f"image.tag={refs['spotray'][1]}",
        "--set", f"controller.image.repository={refs['controller'][0]}",
        "--set", f"controller.image.tag={refs['controller'][1]}",
        "--set", "image.pullPolicy=Never",
        "--set", f"minio.image.repository={refs['minio'][0]}", "--set", f"minio.image.tag={refs['minio'][1]}",
        "--set", f"minio.mcImage.repository={refs['mc'][0]}", "--set", f"minio.mcImage.tag={refs['mc'][1]}",
    ]  # fmt: skip


def install_chart(testbed: tb.Testbed, *extra: str) -> dict[str, str]:
    """The S3 Secret, MinIO's volume and `helm install --wait`; returns the S3 env for this machine."""
    keys = {"AWS_ACCESS_KEY_ID": ROOT_USER, "AWS_SECRET_ACCESS_KEY": ROOT_PASSWORD}
    for namespace in (SYSTEM_NAMESPACE, NAMESPACE):
        testbed.kubectl("create", "namespace", namespace)
        testbed.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
        testbed.kubectl("create", "secret", "generic", SECRET, "-n", namespace,
                        *(f"--from-literal={k}={v}" for k, v in keys.items()))  # fmt: skip
    testbed.apply(minio_volume(testbed))
    helm = [str(tb.binary("helm")), "--kubeconfig", str(testbed.kubeconfig)]
    subprocess.run([*helm, "install", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE, "--wait", "--timeout", "10m",
                    *image_values(), "--set", "minio.enabled=true", "--set", f"s3.existingSecret={SECRET}",
                    "--set", f"controller.watchNamespaces={{{NAMESPACE}}}",
                    "--set", "controller.reconcileIntervalSeconds=2",
                    # The nodes enforce NetworkPolicies; the KubeRay operator and this machine's S3
                    # client (spotray pull) are on the host, outside the pod network. The fabric's
                    # range: a Service's traffic from the host reaches another node masqueraded as
                    # the node that routed it (kube-proxy), as a host-network operator's would.
                    "--set", f"networkPolicy.kuberayIPBlocks={{{tb.real.FABRIC_PREFIX}.0/24}}",
                    "--set", f"networkPolicy.minioIPBlocks={{{tb.real.FABRIC_PREFIX}.0/24}}", *extra],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    minio = pods(testbed, SYSTEM_NAMESPACE, "app.kubernetes.io/component=minio")[0]
    return {"AWS_ENDPOINT_URL": f"http://{minio['status']['podIP']}:9000", "AWS_REGION": "us-east-1", **keys}


def helm(testbed: tb.Testbed) -> list[str]:
    return [str(tb.binary("helm")), "--kubeconfig", str(testbed.kubeconfig)]


def chart_values(testbed: tb.Testbed) -> str:
    """The release's user-supplied values (YAML), to put back with ``upgrade_chart("--reset-values", "-f", ...)``."""
    found = subprocess.run([*helm(testbed), "get", "values", RELEASE, "-n", SYSTEM_NAMESPACE, "-o", "yaml"],
                           check=True, capture_output=True, text=True)  # fmt: skip
    return found.stdout


def upgrade_chart(testbed: tb.Testbed, *args: str, timeout: str = "5m") -> None:
    """`helm upgrade` of the release with ``args`` (values flags); returns once it rolled out."""
    subprocess.run([*helm(testbed), "upgrade", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE, *args,
                    "--wait", "--timeout", timeout], check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def set_chart_values(testbed: tb.Testbed, *values: str) -> None:
    """`helm upgrade --reuse-values` with each ``key=value`` of ``values``; returns once the controller's
    Deployment rolled out (runs created after it get the settings)."""
    upgrade_chart(testbed, "--reuse-values", *(arg for value in values for arg in ("--set", value)))


def set_ray_cluster_per_run(testbed: tb.Testbed, on: bool) -> None:
    """controller.rayClusterPerRun ``on`` (``set_chart_values``)."""
    set_chart_values(testbed, f"controller.rayClusterPerRun={str(on).lower()}")


@contextlib.contextmanager
def demo_cluster(workdir: Path, spot_nodes: int = 1) -> Iterator[DemoCluster]:
    """The test bed on real nodes (one on-demand, ``spot_nodes`` spot) and `helm install` of the
    chart (controller and MinIO as pods)."""
    say(f"starting the test bed in {workdir}: control plane, KubeRay, real nodes (one on-demand, {spot_nodes} spot)")
    real_nodes = [ON_DEMAND_NODE, *(spot_node(index) for index in range(spot_nodes))]
    with tb.Testbed(workdir, nodes=[], real_nodes=real_nodes) as testbed:
        kubeconfig = testbed.kubeconfig
        print(
            "while it runs, from another terminal:\n"
            f"  export KUBECONFIG={kubeconfig}\n"
            f"  kubectl get trainingruns -n {NAMESPACE} -w\n"
            f"  kubectl get pods -A -o wide\n"
            f"  kubectl logs -n {NAMESPACE} -l ray.io/node-type=head -c ray-head -f\n"
            "  make cluster-down    # stops everything this demo started",
            flush=True,
        )
        say(f"helm install {RELEASE} charts/spotray: the controller and MinIO as pods, watching {NAMESPACE}")
        s3_env = install_chart(testbed)
        print(testbed.kubectl("get", "pods", "-n", SYSTEM_NAMESPACE, "-o", "wide").stdout, flush=True)
        yield DemoCluster(testbed, kubeconfig, s3_env)


def demo(workdir: Path, keep: bool) -> int:
    with demo_cluster(workdir) as cluster, contextlib.ExitStack() as stack:
        testbed, kubeconfig = cluster.testbed, cluster.kubeconfig
        manifest = workdir / "trainingrun.yaml"
        manifest.write_text(yaml.safe_dump(demo_training_run(min_step_seconds=DEMO_MIN_STEP_SECONDS), sort_keys=False))
        say(f"kubectl apply -f {manifest}")
        print(testbed.kubectl("apply", "-f", str(manifest)).stdout.strip(), flush=True)

        stop = threading.Event()
        stack.callback(stop.set)
        threading.Thread(target=lose_the_spot_node, args=(testbed, stop), daemon=True).start()
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
        env = cluster.s3_env
        if spotray("pull", str(manifest), str(workdir / "model"), env=env) != 0:
            return 1
        if spotray("plot", str(manifest), "--output", str(workdir / "loss.png"), env=env) != 0:
            return 1
        if keep:
            say(f"kept up: export KUBECONFIG={kubeconfig}; `make cluster-down` (or Ctrl-C) stops it all")
            while True:
                time.sleep(3600)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.cluster_demo", description=__doc__.split("\n\n")[0])
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
