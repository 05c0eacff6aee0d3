"""The GPT-2 job's driver start-up, A vs B (issue 39, item 3): what `python -m spotray.jobs.gpt2` imports
now, against what it imported before the driver and the workers' code were split (the worker
module, with transformers and the model's code).

A driver starts on every attempt before any worker can; on real pods its imports were the largest
phase after the pods themselves (17 s of 51 s from RayJob to first step, docs/goodput.md). Each
round runs both, back to back, in alternating order, as whole processes on this machine:

- A: ``python -m spotray.jobs.gpt2 --help`` (the driver's imports, then its flags; --help exits there);
- B: the same, with the worker module (jobs/gpt2/train.py) imported first, as the driver did before.

Ratio: median of A's wall time over B's, pair by pair; goal <= 0.8 (a cut of at least a fifth). Result:
``bench/results/driver_imports.json``.

    .venv/bin/python -m bench.micro.driver_imports            # 8 rounds, about 7 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.common import alternating_processes, machine_details, paired_ratio, write_result

SIDES = {
    "driver": [sys.executable, "-m", "spotray.jobs.gpt2", "--help"],
    "before": [
        sys.executable,
        "-c",
        "import sys, runpy; import spotray.jobs.gpt2.train; sys.argv = ['gpt2', '--help']; "
        "runpy.run_module('spotray.jobs.gpt2', run_name='__main__')",
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    seconds = alternating_processes(SIDES, args.rounds)
    ratio, pairs = paired_ratio(seconds["driver"], seconds["before"])
    details = {
        "seconds": seconds,
        "medians": {side: statistics.median(values) for side, values in seconds.items()},
        "pair_ratios": pairs,
        "machine": machine_details(),
    }
    print(f"driver imports / before: {ratio:.3f} (median of {len(pairs)} pairs)")
    command = " ".join(["python -m bench.micro.driver_imports", *sys.argv[1:]])
    write_result("driver_imports", ratio, "<= 0.8", "the driver importing the worker module (before the split)",
                 command, details)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
