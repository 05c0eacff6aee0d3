"""Ray's prestarted workers on a local cluster, A vs B (issue 39): the raylet told not to prestart
workers for the first driver (``RAY_prestart_worker_first_driver=0``) against Ray's default.

By default a raylet starts ``num_cpus`` idle Python workers when the first driver registers, with no
job and an empty runtime env, and holds that driver's registration until they are up. Ray Train V2's
actors cannot take them, as read in Ray 2.60's source: its controller and its workers get a runtime env
of their own (env vars it propagates), and a worker process only takes a lease whose runtime env
hashes the same. On 2 cores those processes import Ray beside the driver and Ray Train's first actors,
on every local attempt (local mode starts a cluster per attempt when the fault took the old one:
spotray/local/local_ray.py). On
KubeRay the head has ``num-cpus: 0`` and the driver runs there, so no worker is prestarted: this
measures local mode.

Each leg is a whole process, as local mode runs it: `ray start --head` (LocalRayCluster, 2 CPUs), then
the driver's `ray.init`, then `TorchTrainer.fit()` with one worker whose loop only notes the time; the
figure is `ray.init` -> the loop running. Rounds run both legs back to back, in alternating order.

Ratio: median of A's seconds over B's, pair by pair; goal <= 0.9. Result: bench/results/ray_prestart.json.
Measured 2026-11-29: 1.014 (16.5 s against 16.2 s), so local mode keeps Ray's default (docs/goodput.md).

    .venv/bin/python -m bench.micro.ray_prestart              # 4 rounds, about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import sys
import textwrap
from typing import Any

from bench.common import alternating_rounds, paired_legs, script_leg, write_result

LEG = textwrap.dedent(
    """
    import json, os, shutil, subprocess, sys, tempfile, time
    from spotray.local.local_ray import LocalRayCluster

    env = {} if sys.argv[1] == "default" else {"RAY_prestart_worker_first_driver": "0"}
    with LocalRayCluster(num_cpus=2, env=env) as cluster:
        os.environ.update(cluster.ray_env())  # as local mode starts its driver
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        from spotray.train.launch.launcher import start_autoscaling_coordinator

        began = time.time()
        ray.init(address=cluster.address, logging_level="ERROR")
        connected = time.time()
        start_autoscaling_coordinator()  # as the driver does (bench/micro/ray_train_start.py)
        time.sleep(0.5)
        listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
        idle = sum(1 for line in listed if line.startswith("ray::IDLE"))  # the bench runs alone on the machine
        marks = tempfile.mkdtemp(prefix="ray-prestart-")

        def loop(config):
            import time
            from pathlib import Path
            Path(config["marks"], "loop").write_text(str(time.time()))

        TorchTrainer(loop, train_loop_config={"marks": marks}, scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(storage_path=marks)).fit()
        looped = float(open(marks + "/loop").read())
        shutil.rmtree(marks, ignore_errors=True)
        ray.shutdown()
    print(json.dumps({"init_to_loop_s": round(looped - began, 2), "init_s": round(connected - began, 2),
                      "idle_workers_seen": idle}))
    """
)
SIDES = ("no_prestart", "default")  # A, B


def leg(side: str) -> dict[str, Any]:
    return script_leg(LEG, side)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    legs = alternating_rounds({side: functools.partial(leg, side) for side in SIDES}, args.rounds)
    figure = "the driver's ray.init -> the training loop running, one worker, a fresh local Ray (2 CPUs)"
    ratio, details = paired_legs(legs, "init_to_loop_s", figure)
    print(f"no prestart / Ray's default: {ratio:.3f} (median of {len(details['pair_ratios'])} pairs)")
    command = " ".join(["python -m bench.micro.ray_prestart", *sys.argv[1:]])
    baseline = "Ray's default: num_cpus idle workers prestarted for the first driver"
    write_result("ray_prestart", ratio, "<= 0.9", baseline, command, details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
