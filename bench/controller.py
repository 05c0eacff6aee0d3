"""Create-to-RayJob latency of the controller under a burst, against a no-op kopf operator.

On the Docker-free test bed (real etcd, kube-apiserver, KubeRay; hack/testbed), each round:
- baseline: bench/noop_operator.py watches a fresh namespace; 50 TrainingRuns are created at once
  (50 threads); for each, seconds from just before its create call to the moment a watch on the
  namespace sees the operator's child object (a ConfigMap) appear;
- spotray: `python -m spotray.controller` on another fresh namespace; the same 50 TrainingRuns; seconds
  until a watch sees each run's RayJob `<run>-a1`.
Order alternates between rounds; p50 and p99 over all runs of all rounds. Ratio: spotray p99 /
no-op p99. Goals (issue #6): ratio <= 3 and spotray p99 <= 1 s.

    .venv/bin/python -m bench.controller --runs 50 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench.common import machine_details, write_result

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hack" / "testbed"))
import testbed as tb  # noqa: E402 - shared with the e2e tests

from spotray.train.local_s3 import LocalS3Server  # noqa: E402

CRD = ROOT / "charts" / "spotray" / "crds" / "trainingruns.spotray.dev.yaml"
SECRET = "s3-credentials"  # noqa: S105 - the Secret's name, not a password


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def training_run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -m spotray.jobs.gpt2 --max-steps 10",
            "workers": {"replicas": 1, "cpu": "1", "memory": "1Gi"},
            "checkpoint": {"uri": f"s3://bench/{name}", "secretRef": SECRET},
        },
    }


class ChildWatch:
    """Records when each child object first appears in a namespace (a watch, not polling)."""

    def __init__(self, list_call: Callable[..., Any], namespace: str, name_of: Callable[[str], str | None]) -> None:
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(list_call, namespace, name_of), daemon=True)
        self._thread.start()
        time.sleep(0.5)  # the watch is open before the first create

    def _run(self, list_call: Callable[..., Any], namespace: str, name_of: Callable[[str], str | None]) -> None:
        for event in self._watch.stream(list_call, namespace=namespace, timeout_seconds=600):
            if event["type"] == "ADDED":
                obj = event["object"]
                name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                run = name_of(name)
                if run is not None:
                    self.seen.setdefault(run, time.monotonic())
            if self._stop.is_set():
                break

    def close(self) -> None:
        self._stop.set()
        self._watch.stop()


def start_operator(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{env['SPOTRAY_HEALTH_PORT']}/healthz"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    tb.wait_until(f"{argv[-1]} healthy", healthy, timeout=60, interval=0.3)
    return proc


def one_variant(
    bed: tb.Testbed, s3: LocalS3Server, api: client.ApiClient, variant: str, runs: int, work: Path
) -> list[float]:
    namespace = f"bench-{variant}-{int(time.time() * 1000) % 10_000_000}"
    bed.kubectl("create", "namespace", namespace)
    env = s3.env()
    literals = [
        f"--from-literal={k}={env[k]}" for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    bed.kubectl("create", "secret", "generic", SECRET, "-n", namespace, *literals)
    operator_env = {
        **os.environ,
        "KUBECONFIG": str(bed.kubeconfig),
        "SPOTRAY_NAMESPACES": namespace,
        "SPOTRAY_HEALTH_PORT": str(tb.free_port()),
        "SPOTRAY_METRICS_PORT": str(tb.free_port()),
        "SPOTRAY_SUBMISSION_MODE": "HTTPMode",
    }
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    if variant == "spotray":
        argv = [sys.executable, "-m", "spotray.controller"]
        children = ChildWatch(
            lambda **kw: custom.list_namespaced_custom_object("ray.io", "v1", kw.pop("namespace"), "rayjobs", **kw),
            namespace,
            lambda name: name.removesuffix("-a1") if name.endswith("-a1") else None,
        )
    else:
        argv = [sys.executable, str(ROOT / "bench" / "noop_operator.py")]
        children = ChildWatch(
            core.list_namespaced_config_map,
            namespace,
            lambda name: name.removesuffix("-noop") if name.endswith("-noop") else None,
        )
    operator = start_operator(argv, operator_env, Path(os.environ.get("BENCH_LOG_DIR", work)) / f"{namespace}.log")
    created: dict[str, float] = {}

    def create(name: str) -> None:
        created[name] = time.monotonic()
        custom.create_namespaced_custom_object("spotray.dev", "v1alpha1", namespace, "trainingruns", training_run(name))

    try:
        # A warm-up run, not measured: the operator's watches are open and its clients made.
        create("warmup")
        tb.wait_until("the warm-up run's child", lambda: "warmup" in children.seen, timeout=120, interval=0.1)
        del created["warmup"], children.seen["warmup"]
        with ThreadPoolExecutor(max_workers=runs) as pool:
            list(pool.map(create, [f"run-{index:03d}" for index in range(runs)]))
        tb.wait_until(f"{runs} children in {namespace}", lambda: len(children.seen) >= runs, timeout=300, interval=0.2)
        return [children.seen[name] - created[name] for name in created]
    finally:
        children.close()
        operator.terminate()
        operator.wait(timeout=30)
        # Every variant starts on a quiet cluster: KubeRay's work for this one's RayJobs is torn down first.
        bed.kubectl("delete", "namespace", namespace, "--timeout=300s", check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    latencies: dict[str, list[float]] = {"noop": [], "spotray": []}
    with tempfile.TemporaryDirectory(prefix="spotray-bench-controller-") as tmp:
        work = Path(tmp)
        with tb.Testbed(work / "testbed") as bed, LocalS3Server(work / "s3") as s3:
            bed.kubectl("apply", "--server-side", "-f", str(CRD))
            bed.kubectl("wait", "--for=condition=Established", "crd/trainingruns.spotray.dev", "--timeout=60s")
            api = config.new_client_from_config(str(bed.kubeconfig))
            for round_index in range(args.rounds):
                order = ["noop", "spotray"] if round_index % 2 == 0 else ["spotray", "noop"]
                for variant in order:
                    values = one_variant(bed, s3, api, variant, args.runs, work)
                    latencies[variant] += values
                    print(
                        f"round {round_index + 1} {variant:8s} p50 {percentile(values, 0.5):.3f} s"
                        f"  p99 {percentile(values, 0.99):.3f} s",
                        flush=True,
                    )
    summary = {
        variant: {
            "p50_s": round(percentile(values, 0.5), 4),
            "p99_s": round(percentile(values, 0.99), 4),
            "mean_s": round(statistics.fmean(values), 4),
            "n": len(values),
        }
        for variant, values in latencies.items()
    }
    ratio = summary["spotray"]["p99_s"] / summary["noop"]["p99_s"]
    p99_goal_met = summary["spotray"]["p99_s"] <= 1.0
    print(f"spotray p99 / no-op p99 = {ratio:.2f} (goal <= 3); spotray p99 {summary['spotray']['p99_s']} s (goal <= 1)")
    path = write_result(
        "controller_create_to_rayjob",
        ratio,
        "<= 3.0",
        "a no-op kopf operator creating one ConfigMap per TrainingRun, same test bed, same burst",
        f"python -m bench.controller --runs {args.runs} --rounds {args.rounds}",
        {**summary, "p99_goal_s": 1.0, "p99_goal_met": p99_goal_met, "machine": machine_details()},
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
