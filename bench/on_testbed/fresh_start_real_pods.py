"""A fresh run's start on real pods, A vs B: the Ray pods' readiness probe of spotray against KubeRay's (issue 39).

A RayJob is submitted only once every pod of its Ray cluster is Ready. KubeRay's own readiness probe
(v1.6) first asks 10 s after the container starts, then every 5 s; spotray's (controller/rayjob.py
``readiness_probe``, the chart's ``ray.readinessPeriodSeconds``) asks the same endpoint from the start,
every 2 s. The cluster is testbed/cluster_demo.py's (docs/testbed.md, "Real pods": real kubelets, the
image built from the Dockerfile, the chart installed with helm, a new RayCluster per attempt); each
leg is the GPT-2 job on one CPU worker, a short run that ends in one attempt, after a `helm upgrade`
to its setting; legs alternate pair by pair, and each run's pods are gone before the next starts.
A first run, not counted, warms the nodes' caches: the first start on new nodes reads the image's
files from disk (49 s against 27 s for the next one with the same setting, 2026-11-30).

- A, ``probe``: ``ray.readinessPeriodSeconds=2`` (the default);
- B, ``kuberay``: ``ray.readinessPeriodSeconds=0``: KubeRay's probe.

Measured per leg: the RayJob's creation -> the first step (status.attempts[0].startup.firstStep),
with the pods' own milestones (bench/on_testbed/goodput_testbed.py ``startup_phases``) and the driver's
(bench/on_testbed/recovery_real_pods.py ``resumed_attempt_timeline`` on attempt 1). Ratio: the median with
spotray's probe over the median with KubeRay's (goal <= 0.85); the issue's absolute goal, <= 30 s
from the RayJob to the first step of a fresh run with a warm image, is in the details with what was met.

Result: ``bench/results/fresh_start_real_pods.json``.

    .venv/bin/python -m bench.on_testbed.fresh_start_real_pods        # make bench-fresh-start-real-pods (~10 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import alternating_pairs, machine_details, write_result
from bench.on_testbed.goodput_testbed import run_leg
from bench.on_testbed.recovery_real_pods import driver_logs_followed, resumed_attempt_timeline
from spotray.contract.names import SUCCEEDED
from testbed import cluster_demo

NAME = "fresh_start_real_pods"
GOAL = "<= 0.85"
GOAL_FRESH_START_S = 30  # the issue's: RayJob created -> first step of a fresh run, warm image
SETTINGS = {"probe": 2, "kuberay": 0}  # leg -> ray.readinessPeriodSeconds
RUN_TIMEOUT_S = 600.0
PODS_GONE_TIMEOUT_S = 300.0


def fresh_start_leg(
    cluster: cluster_demo.DemoCluster, workdir: Path, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    driver_log = workdir / f"{name}-a1-driver.log"
    with driver_logs_followed(cluster.testbed, name, {1: driver_log}):
        row = run_leg(cluster, workdir, name, args.steps, args.steps, [], RUN_TIMEOUT_S)
    timeline = resumed_attempt_timeline(cluster, name, driver_log, attempt=1)
    cluster_demo.delete_run(cluster.testbed, name, PODS_GONE_TIMEOUT_S)
    return {
        "name": name,
        "phase": row["phase"],
        "attempts": row["attempts"],
        "rayjob_to_first_step_s": timeline["first step"],
        "from_the_rayjob_s": timeline,
        "startup_phases_s": row["startup_phases_s"],
        "seconds": row["seconds"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="A vs B pairs (probe, kuberay), alternating")
    parser.add_argument("--steps", type=int, default=30, help="training steps of each run (one checkpoint, at the end)")
    parser.add_argument("--warmup", type=int, default=1, help="runs before the pairs, not counted (the nodes' caches)")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-fresh-start-real-pods", help="work directory"
    )
    args = parser.parse_args()
    workdir = args.dir.resolve()
    legs: list[dict[str, Any]] = []
    warmups: list[dict[str, Any]] = []
    with cluster_demo.as_supervisor(workdir), cluster_demo.demo_cluster(workdir) as cluster:
        for number in range(1, args.warmup + 1):
            cluster_demo.say(f"warm-up {number}: a fresh run of {args.steps} steps, not counted")
            warmups.append({"setting": "probe", **fresh_start_leg(cluster, workdir, f"warmup-{number}", args)})
            print(json.dumps(warmups[-1]), flush=True)
        for setting, name in alternating_pairs(args.pairs, "probe", "kuberay"):
            cluster_demo.set_chart_values(cluster.testbed, f"ray.readinessPeriodSeconds={SETTINGS[setting]}")
            cluster_demo.say(f"{name}: a fresh run of {args.steps} steps")
            row = {"setting": setting, **fresh_start_leg(cluster, workdir, name, args)}
            print(json.dumps(row), flush=True)
            legs.append(row)
    wrong = [leg for leg in legs if leg["phase"] != SUCCEEDED or leg["rayjob_to_first_step_s"] is None]
    if wrong:
        print(f"legs that did not succeed, or logged no first step: {wrong}; no result written", file=sys.stderr)
        return 1
    medians = {
        setting: statistics.median(leg["rayjob_to_first_step_s"] for leg in legs if leg["setting"] == setting)
        for setting in SETTINGS
    }
    ratio = medians["probe"] / medians["kuberay"]
    print(json.dumps({"median_rayjob_to_first_step_s": medians, "ratio": round(ratio, 3)}), flush=True)
    details = {
        **machine_details(),
        "steps": args.steps,
        "median_rayjob_to_first_step_s": medians,
        "goal_fresh_start_s": GOAL_FRESH_START_S,
        "goal_fresh_start_met": medians["probe"] <= GOAL_FRESH_START_S,
        "legs": legs,
        "warmup_legs_not_counted": warmups,
    }
    baseline = (
        "the same fresh run with KubeRay's own readiness probe on the Ray pods (ray.readinessPeriodSeconds=0: "
        f"first asked 10 s after the container starts, then every 5 s): median {medians['kuberay']:.1f} s "
        "from the RayJob's creation to the first step"
    )
    command = " ".join(["python -m bench.on_testbed.fresh_start_real_pods", *sys.argv[1:]])
    path = write_result(NAME, ratio, GOAL, baseline, command, details)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
