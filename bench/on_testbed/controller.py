"""Create-to-RayJob latency of the controller under a burst, against a no-op kopf operator, and its
steady-state cost once the runs are active.

On the Docker-free test bed (real etcd, kube-apiserver, KubeRay; testbed/), each round:
- baseline: bench/on_testbed/noop_operator.py watches a fresh namespace; N TrainingRuns are created at once
  (50 threads); for each, seconds from just before its create call to the moment a watch on the
  namespace sees the operator's child object (a ConfigMap) appear;
- spotray: `python -m spotray.controller` on another fresh namespace; the same N TrainingRuns;
  seconds until a watch sees each run's RayJob `<run>-a1`.
Then, with all N runs active and none being created, ``--settle-seconds`` later, the steady state
over ``--steady-seconds``: the operator's API requests per second (the API server's audit log:
each operator runs as its own ServiceAccount) and its CPU (user + system time from /proc).
Order alternates between rounds; p50 and p99 over all runs of all rounds. Ratio: spotray p99 /
no-op p99.

    .venv/bin/python -m bench.on_testbed.controller --runs 50 --rounds 2     # controller_create_to_rayjob
    .venv/bin/python -m bench.on_testbed.controller --runs 1000 --rounds 1   # controller_scale

Goals: at 50 runs (issue #6) ratio <= 3 and spotray p99 <= 1 s; at 1,000 runs (issue #17) every
RayJob exists, ratio <= 2, and the controller uses at most half a core with 1,000 runs active.
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

import testbed.cluster as tb
from bench.common import ROOT, machine_details, write_result
from spotray.contract.names import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, S3_OPT_IN_LABEL, VERSION
from spotray.train.processes.subprocesses import cpu_seconds
from spotray.train.storage.local_s3 import LocalS3Server

CRD = ROOT / "charts" / "spotray" / "crds" / "trainingruns.spotray.dev.yaml"
SECRET = "s3-credentials"  # noqa: S105 - the Secret's name, not a password
OPERATOR_ACCOUNT = "bench-operator"
CREATE_THREADS = 50
SCALE_RUNS = 200  # from this many runs on, the result is controller_scale


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def training_run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
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
        # A watch can end early (the API server under load); a new one lists what exists again, and
        # setdefault keeps the first sighting of each.
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(list_call, namespace=namespace, timeout_seconds=600):
                    if event["type"] == "ADDED":
                        obj = event["object"]
                        name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                        run = name_of(name)
                        if run is not None:
                            self.seen.setdefault(run, time.monotonic())
                    if self._stop.is_set():
                        return
            except Exception as error:  # noqa: BLE001 - any end of the stream: watch again
                if not self._stop.is_set():
                    print(f"(watch on {namespace} ended: {error}; watching again)", flush=True)
                    time.sleep(0.5)

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


def scrape(url: str) -> dict[str, float]:
    """The spotray_* samples of a Prometheus text page (the controller's /metrics)."""
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - http://127.0.0.1 built above
        text = response.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith("spotray_")
        and "_created" not in name  # the counters' creation times
        and not name.startswith(("spotray_reconcile_seconds", "spotray_trainingruns"))
    }


def steady_state(
    bed: tb.Testbed, operator: subprocess.Popen[bytes], account: str, seconds: float, metrics_url: str | None
) -> dict[str, Any]:
    """The operator's API requests and CPU over ``seconds`` with nothing being created."""
    before = scrape(metrics_url) if metrics_url else {}
    cpu_before, started = cpu_seconds(operator.pid), time.time()
    time.sleep(seconds)
    cpu_after, ended = cpu_seconds(operator.pid), time.time()
    if cpu_before is None or cpu_after is None:
        raise RuntimeError(f"the operator (pid {operator.pid}) exited during the steady-state window")
    after = scrape(metrics_url) if metrics_url else {}
    requests = bed.request_counts(account, started, ended)
    span = ended - started
    found: dict[str, Any] = {
        "seconds": round(span, 1),
        "api_requests_per_second": round(sum(requests.values()) / span, 2),
        "api_requests_by_kind": dict(requests.most_common()),
        "cpu_cores": round((cpu_after - cpu_before) / span, 3),
    }
    if after:  # the controller's own counters over the window, and its refresh interval at the end
        found["controller_metrics"] = {
            name: round(value - before.get(name, 0.0), 3) if name.endswith("_total") else value
            for name, value in after.items()
        }
    return found


def one_variant(
    bed: tb.Testbed,
    s3: LocalS3Server,
    api: client.ApiClient,
    variant: str,
    args: argparse.Namespace,
    work: Path,
) -> tuple[list[float], dict[str, Any]]:
    runs = args.runs
    namespace = f"bench-{variant}-{int(time.time() * 1000) % 10_000_000}"
    bed.kubectl("create", "namespace", namespace)
    env = s3.env()
    literals = [
        f"--from-literal={k}={env[k]}" for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    bed.kubectl("create", "secret", "generic", SECRET, "-n", namespace, *literals)
    bed.kubectl("label", "secret", SECRET, "-n", namespace, f"{S3_OPT_IN_LABEL}=true")
    # Each operator runs as its own ServiceAccount, so that the audit log holds its requests.
    kubeconfig, account = bed.namespace_admin_kubeconfig(namespace, OPERATOR_ACCOUNT, work / f"{namespace}.kubeconfig")
    health_port, metrics_port = tb.free_ports(2)
    operator_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "SPOTRAY_NAMESPACES": namespace,
        "SPOTRAY_HEALTH_PORT": str(health_port),
        "SPOTRAY_METRICS_PORT": str(metrics_port),
        "SPOTRAY_SUBMISSION_MODE": "HTTPMode",
        "SPOTRAY_ALLOWED_S3_ENDPOINTS": s3.endpoint_url,
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
        argv = [sys.executable, str(ROOT / "bench" / "on_testbed" / "noop_operator.py")]
        children = ChildWatch(
            core.list_namespaced_config_map,
            namespace,
            lambda name: name.removesuffix("-noop") if name.endswith("-noop") else None,
        )
    operator = start_operator(argv, operator_env, Path(os.environ.get("BENCH_LOG_DIR", work)) / f"{namespace}.log")
    created: dict[str, float] = {}

    def create(name: str) -> None:
        created[name] = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, training_run(name))

    try:
        # A warm-up run, not measured: the operator's watches are open and its clients made.
        create("warmup")
        tb.wait_until("the warm-up run's child", lambda: "warmup" in children.seen, timeout=120, interval=0.1)
        del created["warmup"], children.seen["warmup"]
        with ThreadPoolExecutor(max_workers=min(runs, CREATE_THREADS)) as pool:
            list(pool.map(create, [f"run-{index:04d}" for index in range(runs)]))
        try:
            tb.wait_until(
                f"{runs} children in {namespace}",
                lambda: len(children.seen) >= runs,
                timeout=max(300, runs * 0.6),
                interval=0.2,
            )
        except TimeoutError:
            missing = sorted(set(created) - set(children.seen))
            print(f"{variant}: {len(missing)} of {runs} children missing, e.g. {missing[:5]}", flush=True)
        latencies = [children.seen[name] - created[name] for name in created if name in children.seen]
        extra: dict[str, Any] = {"children": len(children.seen), "runs": runs}
        if args.steady_seconds > 0:
            time.sleep(args.settle_seconds)
            metrics_url = f"http://127.0.0.1:{operator_env['SPOTRAY_METRICS_PORT']}/metrics"
            extra["steady"] = steady_state(
                bed, operator, account, args.steady_seconds, metrics_url if variant == "spotray" else None
            )
            print(f"  {variant} steady state: {extra['steady']}", flush=True)
        return latencies, extra
    finally:
        children.close()
        operator.terminate()
        operator.wait(timeout=30)
        # Every variant starts on a quiet cluster: KubeRay's work for this one's RayJobs is torn down first.
        bed.kubectl("delete", "namespace", namespace, "--timeout=600s", check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="TrainingRuns created at once per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--steady-seconds", type=float, default=None, help="steady-state window (default: 120 from 200 runs, else 0)"
    )
    parser.add_argument("--settle-seconds", type=float, default=60, help="wait after the burst before measuring it")
    args = parser.parse_args()
    scale = args.runs >= SCALE_RUNS
    if args.steady_seconds is None:
        args.steady_seconds = 120.0 if scale else 0.0
    latencies: dict[str, list[float]] = {"noop": [], "spotray": []}
    extras: dict[str, list[dict[str, Any]]] = {"noop": [], "spotray": []}
    with tempfile.TemporaryDirectory(prefix="spotray-bench-controller-") as tmp:
        work = Path(tmp)
        with tb.Testbed(work / "testbed") as bed, LocalS3Server(work / "s3") as s3:
            s3.create_bucket("bench")  # the runs' checkpoint bucket: the controller reads it once a job starts
            bed.kubectl("apply", "--server-side", "-f", str(CRD))
            bed.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
            api = config.new_client_from_config(str(bed.kubeconfig))
            for round_index in range(args.rounds):
                order = ["noop", "spotray"] if round_index % 2 == 0 else ["spotray", "noop"]
                for variant in order:
                    values, extra = one_variant(bed, s3, api, variant, args, work)
                    latencies[variant] += values
                    extras[variant].append(extra)
                    print(
                        f"round {round_index + 1} {variant:8s} {len(values)}/{args.runs} children"
                        f"  p50 {percentile(values, 0.5):.3f} s  p99 {percentile(values, 0.99):.3f} s",
                        flush=True,
                    )
    summary: dict[str, Any] = {
        variant: {
            "p50_s": round(percentile(values, 0.5), 4),
            "p99_s": round(percentile(values, 0.99), 4),
            "mean_s": round(statistics.fmean(values), 4),
            "n": len(values),
            "rounds": extras[variant],
        }
        for variant, values in latencies.items()
    }
    ratio = summary["spotray"]["p99_s"] / summary["noop"]["p99_s"]
    every_rayjob = all(extra["children"] >= args.runs for extra in extras["spotray"])
    command = f"python -m bench.on_testbed.controller --runs {args.runs} --rounds {args.rounds}"
    machine = {"machine": machine_details()}
    if not scale:
        p99_goal_met = summary["spotray"]["p99_s"] <= 1.0
        print(f"spotray p99 / no-op p99 = {ratio:.2f} (goal <= 3); spotray p99 {summary['spotray']['p99_s']} s")
        path = write_result(
            "controller_create_to_rayjob",
            ratio,
            "<= 3.0",
            "a no-op kopf operator creating one ConfigMap per TrainingRun, same test bed, same burst",
            command,
            {**summary, "p99_goal_s": 1.0, "p99_goal_met": p99_goal_met, **machine},
        )
    else:
        cores = [extra["steady"]["cpu_cores"] for extra in extras["spotray"] if "steady" in extra]
        cpu_goal_met = bool(cores) and max(cores) <= 0.5
        print(
            f"spotray p99 / no-op p99 = {ratio:.2f} (goal <= 2); every RayJob: {every_rayjob};"
            f" steady-state controller CPU {cores} cores (goal <= 0.5)"
        )
        path = write_result(
            "controller_scale",
            ratio,
            "<= 2.0",
            f"a no-op kopf operator creating one ConfigMap per TrainingRun, same test bed, same burst of {args.runs}",
            command,
            {
                **summary,
                "every_rayjob_created": every_rayjob,
                "steady_cpu_goal_cores": 0.5,
                "steady_cpu_goal_met": cpu_goal_met,
                "settle_seconds": args.settle_seconds,
                **machine,
            },
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
