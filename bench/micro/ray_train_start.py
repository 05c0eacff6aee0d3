"""Ray Train's start on a fresh Ray cluster, A vs B (issue 39): with the driver asking for Ray Train's
AutoscalingCoordinator as it connects (spotray/train/launch/launcher.py `start_autoscaling_coordinator`),
against leaving Ray Train to make it when its controller starts.

Every attempt on a new cluster (a RayJob's own RayCluster, a local attempt after a lost head or a
spot notice) pays this start before its first step. Each leg is a whole process: `ray.init` starts a
local cluster (2 CPUs), then `TorchTrainer.fit()` runs one worker whose loop only notes the time;
the figure is fit() -> the loop running. Rounds run both legs back to back, in alternating order.

- A: `start_autoscaling_coordinator()` right after `ray.init`, as the driver does;
- B: without it (Ray Train's controller creates the actor, and waits up to 5 s per ask for it).

Ratio: median of A's seconds over B's, pair by pair; goal <= 0.9. Result: bench/results/ray_train_start.json.

    .venv/bin/python -m bench.micro.ray_train_start            # 4 rounds, about 9 minutes on 2 cores
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
    import json, shutil, sys, tempfile, time
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from spotray.train.launch.launcher import start_autoscaling_coordinator

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    if sys.argv[1] == "early":
        start_autoscaling_coordinator()
    marks = tempfile.mkdtemp(prefix="ray-train-start-")

    def loop(config):
        import time
        from pathlib import Path
        Path(config["marks"], "loop").write_text(str(time.time()))

    began = time.time()
    TorchTrainer(loop, train_loop_config={"marks": marks}, scaling_config=ScalingConfig(num_workers=1),
                 run_config=RunConfig(storage_path=marks)).fit()
    ended = time.time()
    looped = float(open(marks + "/loop").read())
    shutil.rmtree(marks, ignore_errors=True)
    print(json.dumps({"fit_to_loop_s": round(looped - began, 2), "fit_s": round(ended - began, 2)}))
    """
)
SIDES = ("early", "ray_train")  # A, B


def leg(side: str) -> dict[str, Any]:
    result, output = script_leg(LEG, side)
    # Ray Train's own words when an ask of the coordinator timed out: the wait this removes.
    result["asks_timed_out"] = output.count("Failed to send resource request")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    legs = alternating_rounds({side: functools.partial(leg, side) for side in SIDES}, args.rounds)
    figure = "TorchTrainer.fit() -> the training loop running, one worker, a fresh local Ray (2 CPUs)"
    ratio, details = paired_legs(legs, "fit_to_loop_s", figure)
    print(f"coordinator asked early / by Ray Train: {ratio:.3f} (median of {len(details['pair_ratios'])} pairs)")
    command = " ".join(["python -m bench.micro.ray_train_start", *sys.argv[1:]])
    write_result("ray_train_start", ratio, "<= 0.9", "Ray Train creating its AutoscalingCoordinator itself",
                 command, details)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
