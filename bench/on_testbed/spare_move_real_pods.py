"""The second reclaim of a run with a spare, on real pods, A vs B: the idle spare moved or not (issue 39).

After a reclaim the run goes on on its spare, and KubeRay makes the lost pod's replacement at once,
while the reclaimed node is gone: the scheduler puts it beside the worker, on the one spot node
left. At the next reclaim of that node worker and spare go together (docs/goodput.md: 26 s to
train again instead of 16 s). The controller now moves such an idle spare off its worker's node
(controller/spare_placement.py); this benchmark measures what that buys.

The cluster is testbed/cluster_demo.py's with two spot nodes, the run's Ray cluster kept across
attempts (controller.rayClusterPerRun) and ``spareReplicas: 1``. Each leg trains one run and
reclaims the node of the pod that runs the Ray Train worker twice, at ``--reclaims`` steps (each
time once both worker pods are Ready), as bench/on_testbed/spare_real_pods.py does once:

- A, ``controller.moveIdleSpares=true`` (the default): the replacement spare is moved off;
- B, ``controller.moveIdleSpares=false``: it stays where the scheduler first put it.

Legs alternate, with a ``helm upgrade`` between them. Measured per reclaim, from the run's
progress objects: notice -> the first step of the first worker group started after it; and the
worker pods' nodes just before each reclaim. Ratio: the median of A's second reclaims over B's
(goal <= 0.75: a second reclaim about as fast as a first).

Result: ``bench/results/spare_move_real_pods.json``.

    .venv/bin/python -m bench.on_testbed.spare_move_real_pods    # make bench-spare-move-real-pods (~25 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import alternating_pairs, machine_details, write_result
from bench.on_testbed.goodput_testbed import attempt_lines, current_step, first_group_after
from bench.on_testbed.spare_real_pods import RECLAIM_MOMENT_TIMEOUT_S, wait_for_reclaim_moment, wait_until_done
from spotray.contract.names import SUCCEEDED
from spotray.train.records.progress_log import read_run_progress
from spotray.train.storage.store import open_store
from testbed import cluster_demo

NAME = "spare_move_real_pods"
GOAL = "<= 0.75"
SETTINGS = {"moved": True, "kept": False}  # leg -> controller.moveIdleSpares


def run_leg(cluster: cluster_demo.DemoCluster, workdir: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    document = cluster_demo.demo_training_run(
        f"{cluster_demo.POD_JOB_DIR}/{name}",
        name=name,
        steps=args.steps,
        every=args.interval,
        spares=1,
        min_step_seconds=args.step_seconds,
    )
    manifest = workdir / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))
    cluster.testbed.kubectl("apply", "-f", str(manifest))
    started = time.monotonic()
    reclaims: list[dict[str, Any]] = []
    for step in args.reclaims:
        status, ready = wait_for_reclaim_moment(cluster, name, step, 2, RECLAIM_MOMENT_TIMEOUT_S)
        node = cluster_demo.training_worker_node(cluster.testbed, ready)
        if node is None:
            raise RuntimeError(
                f"{name}: no worker pod of {[p['metadata']['name'] for p in ready]} runs a RayTrainWorker"
            )
        pods_at = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in ready}
        at_step = current_step(status)
        noticed = cluster_demo.reclaim_worker_node(cluster.testbed, status, name, threading.Event(), node=node)
        reclaims.append({"step": at_step, "node": node, "worker_pods": pods_at, "noticed": noticed})
    status = wait_until_done(cluster, name, 900.0)
    moves = f"reason=SpareMoved,involvedObject.name={name}"
    messages = "jsonpath={range .items[*]}{.message}{'\\n'}{end}"
    events = cluster.testbed.kubectl(
        "get", "events", "-n", cluster_demo.NAMESPACE, "--field-selector", moves, "-o", messages, check=False
    ).stdout.split("\n")  # fmt: skip
    os.environ.update(cluster.s3_env)  # this machine reads the run's progress from MinIO
    history = read_run_progress(open_store(document["spec"]["checkpoint"]["uri"], checkpoint_key=None))
    for reclaim in reclaims:
        reclaim.update(first_group_after(history, reclaim.pop("noticed")))
        reclaim["beside_the_worker"] = len(set(reclaim["worker_pods"].values())) == 1
    cluster_demo.delete_run(cluster.testbed, name)
    return {
        "name": name,
        "setting": "moved" if name.startswith("moved") else "kept",
        "phase": status.get("phase"),
        "attempts": attempt_lines(status),
        "seconds": round(time.monotonic() - started, 1),
        "goodput": (status.get("goodput") or {}).get("ratio"),
        "spare_moved_events": [line for line in events if line],
        "reclaims": reclaims,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="A vs B pairs (moved, kept), alternating")
    parser.add_argument("--steps", type=int, default=600, help="training steps of each run")
    parser.add_argument("--interval", type=int, default=50, help="checkpoint interval, in steps")
    parser.add_argument(
        "--reclaims", type=int, nargs=2, default=[120, 420], help="the steps at which the worker's node is reclaimed"
    )
    parser.add_argument("--step-seconds", type=float, default=0.25, help="each step's least time")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-spare-move-real-pods", help="work directory"
    )
    args = parser.parse_args()
    workdir = args.dir.resolve()
    legs: list[dict[str, Any]] = []
    with cluster_demo.as_supervisor(workdir), cluster_demo.demo_cluster(workdir, spot_nodes=2) as cluster:
        cluster_demo.set_ray_cluster_per_run(cluster.testbed, True)
        for setting, name in alternating_pairs(args.pairs, "moved", "kept"):
            cluster_demo.set_chart_values(
                cluster.testbed, f"controller.moveIdleSpares={str(SETTINGS[setting]).lower()}"
            )
            cluster_demo.say(f"{name}: {args.steps} steps, the worker's node reclaimed at steps {args.reclaims}")
            row = run_leg(cluster, workdir, name, args)
            print(json.dumps(row), flush=True)
            legs.append(row)
    failed = [leg["name"] for leg in legs if leg["phase"] != SUCCEEDED]
    if failed:
        print(f"legs that did not succeed: {failed}; no result written", file=sys.stderr)
        return 1
    second = {
        setting: statistics.median(
            leg["reclaims"][1]["notice_to_training_again_s"] for leg in legs if leg["setting"] == setting
        )
        for setting in SETTINGS
    }
    ratio = second["moved"] / second["kept"]
    print(json.dumps({"median_second_reclaim_s": second, "ratio": round(ratio, 3)}), flush=True)
    details = {
        **machine_details(),
        "steps": args.steps,
        "interval": args.interval,
        "reclaims_at": args.reclaims,
        "step_seconds": args.step_seconds,
        "spot_nodes": 2,
        "spot_node_back_after_s": cluster_demo.SPOT_BACK_AFTER_S,
        "median_second_reclaim_notice_to_training_again_s": second,
        "median_first_reclaim_notice_to_training_again_s": {
            setting: statistics.median(
                leg["reclaims"][0]["notice_to_training_again_s"] for leg in legs if leg["setting"] == setting
            )
            for setting in SETTINGS
        },
        "legs": legs,
    }
    baseline = (
        "the same run and reclaims with controller.moveIdleSpares=false (the replacement spare stays beside the "
        f"worker): median {second['kept']:.1f} s notice -> training again at the second reclaim"
    )
    command = " ".join(["python -m bench.on_testbed.spare_move_real_pods", *sys.argv[1:]])
    print(f"wrote {write_result(NAME, ratio, GOAL, baseline, command, details)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
