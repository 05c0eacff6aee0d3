"""Starting a process from a venv compiled to bytecode, A vs B (issue 39, item 3): the GPT-2 job's worker
and driver imports with the venv's .pyc files, against the same imports compiled from source.

uv installs no .pyc files, and where PYTHONDONTWRITEBYTECODE is set (this project's Dockerfile, many
CI and sandbox images, this machine) Python never writes them: every process, each Ray worker and
driver of every attempt included, compiled torch, transformers and Ray from source as it started.
`make setup` now syncs with ``--compile-bytecode``. Each round runs every side, back to back, in
alternating order, as whole processes:

- A: ``python -c "import spotray.jobs.gpt2.train"`` (what every Ray Train worker imports), with the
  venv's .pyc files;
- B: the same, with ``PYTHONPYCACHEPREFIX`` on an empty directory and ``PYTHONDONTWRITEBYTECODE=1``,
  so Python finds no .pyc and writes none: the venv as it was;
- and the driver, ``python -m spotray.jobs.gpt2 --help``, both ways (in the details).

Ratio: median of A's wall time over B's for the worker, pair by pair; goal <= 0.7. Result:
bench/results/bytecode.json.

    .venv/bin/python -m bench.micro.bytecode                  # 4 rounds, about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

from bench.common import alternating_processes, machine_details, paired_ratio, scratch_dir, write_result

WORKER = [sys.executable, "-c", "import spotray.jobs.gpt2.train"]
DRIVER = [sys.executable, "-m", "spotray.jobs.gpt2", "--help"]


def venv_is_compiled() -> bool:
    """Whether the installed packages have their bytecode (a venv that `make setup` made)."""
    spec = importlib.util.find_spec("transformers")  # where it is, without the 10 s import
    if spec is None or spec.origin is None:
        return False
    return Path(importlib.util.cache_from_source(spec.origin)).exists()


def exit_unless_compiled() -> None:
    """A benchmark of the compiled venv against source means nothing on a venv that was never compiled."""
    if not venv_is_compiled():
        raise SystemExit("the venv has no bytecode: run `make setup` (uv sync --compile-bytecode) first")


def from_source_env(empty_prefix: Path) -> dict[str, str]:
    """The variables under which a process finds no .pyc and writes none: the venv as it was."""
    return {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(empty_prefix)}


def sides(empty_prefix: Path) -> dict[str, list[str]]:
    from_source = ["env", *(f"{name}={value}" for name, value in from_source_env(empty_prefix).items())]
    return {
        "worker_compiled": WORKER,
        "worker_source": [*from_source, *WORKER],
        "driver_compiled": DRIVER,
        "driver_source": [*from_source, *DRIVER],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    exit_unless_compiled()
    with scratch_dir("spotray-bench-pyc-") as empty_prefix:
        seconds = alternating_processes(sides(empty_prefix), args.rounds)
    ratio, pairs = paired_ratio(seconds["worker_compiled"], seconds["worker_source"])
    driver_ratio, driver_pairs = paired_ratio(seconds["driver_compiled"], seconds["driver_source"])
    medians = {side: statistics.median(values) for side, values in seconds.items()}
    print(f"worker imports, compiled / from source: {ratio:.3f}; driver: {driver_ratio:.3f}")
    write_result(
        "bytecode",
        ratio,
        "<= 0.7",
        f"the same imports compiled from source (no .pyc, as uv sync left the venv under "
        f"PYTHONDONTWRITEBYTECODE): the worker {medians['worker_compiled']:.1f} s vs "
        f"{medians['worker_source']:.1f} s median",
        " ".join(["python -m bench.micro.bytecode", *sys.argv[1:]]),
        {
            "seconds": seconds,
            "medians": medians,
            "pair_ratios": pairs,
            "driver_ratio": round(driver_ratio, 4),
            "driver_pair_ratios": driver_pairs,
            "machine": machine_details(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
