"""Goodput of a long run on real pods with a reclaim every 10 minutes, against the same run
uninterrupted (issue #39, item 4: a run of at least 30 minutes, goal >= 0.95 of the uninterrupted).

The test bed, the run and the reclaim are bench/on_testbed/goodput_testbed.py's (testbed/cluster_demo.py: two real
kubelets, the chart's controller and MinIO as pods, the GPT-2 job on one CPU worker on the spot
node). Its steps are paced (``--min-step-seconds``) so that the run lasts as long as a real one: the
tiny model unpaced runs 10 steps a second, and a half-hour run of it would be 18,000 steps of a toy.
The reclaims are set in time, not drawn: one every ``--reclaim-every-minutes`` of training, half a
period in (at 5, 15 and 25 minutes of a 30-minute run), so each lands mid-way between two of the
run's restarts and the count per run is fixed. ``--ray-cluster-per-run`` turns the chart's
``controller.rayClusterPerRun`` on for both runs (the next attempt on the kept head); off, each
attempt has a RayCluster of its own, the product's default. ``--spares N`` gives both runs N spare
worker pods (``spec.workers.spareReplicas``) on N more spot nodes, and each reclaim takes the node of
the pod that runs the Ray Train worker: the run goes on on a spare in its attempt (docs/goodput.md,
"Spare worker pods"); notice -> training again is then read from the run's progress records.

Result: ``bench/results/NAME.json`` (default ``goodput_real_pods_long``); ratio: the reclaimed
run's goodput over the uninterrupted run's, both from their ``status.goodput``, taken in the same
invocation one after the other on the same test bed.

    .venv/bin/python -m bench.on_testbed.goodput_long        # make bench-goodput-long (about 70 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import machine_details, write_result
from bench.on_testbed.goodput_testbed import run_leg
from spotray.contract.names import SUCCEEDED
from testbed import cluster_demo

GOAL = ">= 0.95"


def reclaim_steps(steps: int, step_seconds: float, every_s: float) -> list[int]:
    """The steps at which to reclaim: one every ``every_s`` seconds of paced training, the first half
    a period in, none in the last half period (the run would end before its notice landed)."""
    if step_seconds <= 0 or every_s <= 0:
        raise ValueError("the step pace and the reclaim period must be positive")
    period = every_s / step_seconds
    found: list[int] = []
    at = period / 2
    while at <= steps - period / 2:
        found.append(round(at))
        at += period
    return found


def leg_timeout_s(steps: int, step_seconds: float, reclaims: int) -> float:
    """How long one leg may take before it is judged stalled: its paced steps with slack for slower
    ones, 10 minutes to start, and 5 minutes for each reclaim's restart."""
    return 600.0 + steps * (step_seconds + 0.2) + 300.0 * reclaims


def goodput_ratio(uninterrupted: dict[str, Any], reclaimed: dict[str, Any]) -> float | None:
    """The reclaimed run's goodput over the uninterrupted run's; None unless both succeeded with one."""
    for run in (uninterrupted, reclaimed):
        if run.get("phase") != SUCCEEDED or not run.get("goodput"):
            return None
    return float(reclaimed["goodput"]) / float(uninterrupted["goodput"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time asked of each run")
    parser.add_argument("--min-step-seconds", type=float, default=0.5, help="each step's pace")
    parser.add_argument("--reclaim-every-minutes", type=float, default=10.0, help="one reclaim per this much training")
    parser.add_argument("--interval", type=int, default=120, help="checkpoint interval, in steps")
    parser.add_argument(
        "--ray-cluster-per-run", action="store_true", help="keep one Ray cluster per run (controller.rayClusterPerRun)"
    )
    parser.add_argument("--spares", type=int, default=0, help="spare worker pods of each run, each on a spot node")
    parser.add_argument("--name", default="goodput_real_pods_long", help="the result's name: bench/results/NAME.json")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-goodput-long", help="work directory"
    )
    args = parser.parse_args()
    steps = round(args.minutes * 60 / args.min_step_seconds)
    reclaims = reclaim_steps(steps, args.min_step_seconds, args.reclaim_every_minutes * 60)
    if not reclaims:
        parser.error(f"no reclaim fits in {args.minutes:g} minutes at one per {args.reclaim_every_minutes:g}")
    workdir = args.dir.resolve()
    runs = []
    with cluster_demo.as_supervisor(workdir), cluster_demo.demo_cluster(workdir, spot_nodes=1 + args.spares) as cluster:
        if args.ray_cluster_per_run:
            cluster_demo.set_ray_cluster_per_run(cluster.testbed, True)
        for name, planned in (("uninterrupted", []), ("reclaimed", reclaims)):
            timeout_s = leg_timeout_s(steps, args.min_step_seconds, len(planned))
            cluster_demo.say(
                f"{name}: {steps} steps of {args.min_step_seconds:g} s, a checkpoint every {args.interval}, "
                f"reclaims at {planned} (this leg may take {timeout_s / 60:.0f} minutes)"
            )
            row = run_leg(
                cluster,
                workdir,
                name,
                steps,
                args.interval,
                planned,
                timeout_s,
                min_step_seconds=args.min_step_seconds,
                spares=args.spares,
            )
            print(json.dumps(row), flush=True)
            runs.append(row)
    uninterrupted, reclaimed = runs
    ratio = goodput_ratio(uninterrupted, reclaimed)
    if ratio is None:
        print("a run did not succeed, or reported no goodput: no result written", file=sys.stderr)
        return 1
    details = {
        **machine_details(),
        "minutes": args.minutes,
        "min_step_seconds": args.min_step_seconds,
        "steps": steps,
        "interval": args.interval,
        "reclaim_every_minutes": args.reclaim_every_minutes,
        "ray_cluster_per_run": args.ray_cluster_per_run,
        "spares": args.spares,
        "goodput": {"uninterrupted": uninterrupted["goodput"], "reclaimed": reclaimed["goodput"]},
        "runs": runs,
    }
    baseline = (
        f"the same run of {steps} steps paced at {args.min_step_seconds:g} s, uninterrupted on real pods "
        f"(goodput {uninterrupted['goodput']}); reclaims of the worker's spot node at steps {reclaims}"
    )
    command = "python -m bench.on_testbed.goodput_long " + " ".join(sys.argv[1:])
    path = write_result(args.name, round(ratio, 4), GOAL, baseline, command.strip(), details)
    print(f"goodput {reclaimed['goodput']} reclaimed, {uninterrupted['goodput']} uninterrupted: ratio {ratio:.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
