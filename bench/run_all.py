"""Run every benchmark in turn, then print the results table (the one in docs/benchmarks.md).

make bench                       # all of them
.venv/bin/python -m bench.run_all --only checkpoint resume
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench import results_table

ROOT = Path(__file__).resolve().parent.parent
# name -> the module and its arguments
BENCHMARKS: dict[str, tuple[str, ...]] = {
    "transfer": ("bench.micro.transfer",),
    "checkpoint": ("bench.micro.checkpoint",),
    "notice_checkpoint": ("bench.gpu.notice_checkpoint",),
    "gpu_checkpoint": ("bench.gpu.gpu_checkpoint",),  # says so and exits 0 without CUDA
    "resume": ("bench.micro.resume",),
    "read_once": ("bench.micro.read_once",),
    "node_copies": ("bench.micro.node_copies_resume",),
    "ring_pipeline": ("bench.micro.ring_pipeline",),
    "ring_pipeline_link": ("bench.micro.ring_pipeline", "--link-mb-s", "150"),  # needs root: ip netns
    "ray_vs_torchrun": ("bench.micro.ray_vs_torchrun",),
    "streaming": ("bench.micro.streaming",),
    "recovery": ("bench.micro.recovery",),
    "controller": ("bench.on_testbed.controller",),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), default=sorted(BENCHMARKS))
    parser.add_argument("--table-only", action="store_true", help="print the table of existing results")
    args = parser.parse_args()
    failed = []
    if not args.table_only:
        for name in args.only:
            print(f"\n=== {name} ===", flush=True)
            if subprocess.run([sys.executable, "-m", *BENCHMARKS[name]], cwd=ROOT, check=False).returncode != 0:
                failed.append(name)
    print("\n" + results_table.table())
    if failed:
        print(f"\nbenchmarks that crashed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
