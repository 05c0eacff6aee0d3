"""A worker pod's preStop hook starting, A vs B (issue 39): what `python -m spotray.train.launch.drain`
imports now (Ray alone, train/launch/ray_drain.py) against what it imported before (the launcher:
Ray Train, torch, pandas).

The hook is a new Python process that runs within a spot notice's grace period (GKE gives 30 s):
every second it takes to start is a second less for the emergency checkpoint, and for an elastic run
a second more before it goes on without the node. In bench/micro/elastic_notice.py's runs the hook drained
its node 14 s after the notice. Each round runs both, back to back, in alternating order, as whole
processes (``--help`` exits after the imports):
- A: ``python -m spotray.train.launch.drain --help``;
- B: the same, with the launcher imported first, as the hook did before.
Ratio: median of A's wall time over B's, pair by pair; goal <= 0.5. Result: bench/results/hook_start.json.

    .venv/bin/python -m bench.micro.hook_start                # 6 rounds, about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.common import alternating_processes, machine_details, paired_ratio, write_result

SIDES = {
    "hook": [sys.executable, "-m", "spotray.train.launch.drain", "--help"],
    "before": [
        sys.executable,
        "-c",
        "import sys, runpy; import spotray.train.launch.launcher; sys.argv = ['drain', '--help']; "
        "runpy.run_module('spotray.train.launch.drain', run_name='__main__')",
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    seconds = alternating_processes(SIDES, args.rounds)
    ratio, pairs = paired_ratio(seconds["hook"], seconds["before"])
    medians = {side: statistics.median(values) for side, values in seconds.items()}
    print(f"hook start / before: {ratio:.3f} (median of {len(pairs)} pairs)")
    write_result(
        "hook_start",
        ratio,
        "<= 0.5",
        f"the preStop hook importing the launcher first, as before: {medians['hook']:.1f} s vs "
        f"{medians['before']:.1f} s median to the end of its imports",
        " ".join(["python -m bench.micro.hook_start", *sys.argv[1:]]),
        {"seconds": seconds, "medians": medians, "pair_ratios": pairs, "machine": machine_details()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
