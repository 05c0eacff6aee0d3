"""`make demo`'s goodput line before and after the venv was compiled to bytecode, A vs B (issue 39, item 5).

The demo is the GPT-2 example in local mode with three faults (a worker killed, the head lost, a spot
notice): four starts of a driver and its Ray Train workers, each of which imported torch,
transformers and Ray. Before issue 39's bytecode change every one of those imports was compiled from
source (uv installs no .pyc and PYTHONDONTWRITEBYTECODE is set here). Each round runs the demo
twice, back to back, in alternating order, with the Makefile's own DEMO_FAULTS:

- A (after): as `make demo` runs it now, from the venv's .pyc files;
- B (before): the same with ``PYTHONDONTWRITEBYTECODE=1`` and ``PYTHONPYCACHEPREFIX`` on an empty
  directory, inherited by the driver, Ray and its workers: the venv as it was.

Each run's ledger is read from its event log (train/records/goodput.py, the demo's ``time`` line),
with where each later attempt's start-up went (bench.micro.local_recovery.attempt_phases). Ratio: the
median over rounds of A's goodput over B's; goal >= 1.2. Result: bench/results/demo_goodput.json.

    .venv/bin/python -m bench.micro.demo_goodput              # 2 rounds, about 30 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    alternating_rounds,
    embedded_s3_env,
    machine_details,
    paired_ratio,
    scratch_dir,
    write_result,
)
from bench.micro.bytecode import exit_unless_compiled, from_source_env
from bench.micro.local_recovery import attempt_phases
from spotray.train.records.event_log import read_events
from spotray.train.records.goodput import ledger, split_lifetimes

MANIFEST = ROOT / "jobs" / "gpt2" / "trainingrun.yaml"
GOAL = ">= 1.2"


def demo_faults(makefile: Path = ROOT / "Makefile") -> list[str]:
    """The fault flags `make demo` passes (the Makefile's DEMO_FAULTS), so the benchmark runs the demo itself."""
    match = re.search(r"^DEMO_FAULTS \?= (.+)$", makefile.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"{makefile} has no `DEMO_FAULTS ?= ...` line")
    return shlex.split(match.group(1))


def one_demo(
    root: Path, side: str, env: dict[str, str], faults: list[str], runs: list[dict[str, Any]]
) -> dict[str, float]:
    workdir = root / f"{side}-{sum(run['side'] == side for run in runs) + 1}"
    command = [sys.executable, "-m", "spotray.cli", "run", str(MANIFEST), "--local", "--workdir", str(workdir)]
    started = time.monotonic()
    result = subprocess.run([*command, *faults], cwd=root, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"the {side} demo exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    events = list(read_events(workdir / "events.jsonl"))
    lifetimes, first_event, last_event = split_lifetimes(events)
    if first_event is None or last_event is None:
        raise SystemExit(f"the {side} demo left no events in {workdir}")
    spent = ledger(lifetimes, first_event, last_event)
    run = {
        "side": side,
        "goodput": round(spent.goodput, 4),
        "summary": spent.summary(),
        "lost_s": {cause: round(seconds, 1) for cause, seconds in spent.lost_s.items()},
        "wall_s": round(spent.wall_s, 1),
        "process_wall_s": round(wall, 1),
        "later_attempts": attempt_phases(events),
    }
    runs.append(run)
    return {"goodput": run["goodput"], "wall_s": run["wall_s"], "restarts_s": run["lost_s"]["restarts"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    exit_unless_compiled()
    env = embedded_s3_env()
    faults = demo_faults()
    runs: list[dict[str, Any]] = []
    with scratch_dir("spotray-bench-demo-") as root:
        empty_prefix = root / "no-pyc"
        empty_prefix.mkdir()
        from_source = {**env, **from_source_env(empty_prefix)}
        results = alternating_rounds(
            {
                "compiled": lambda: one_demo(root, "compiled", env, faults, runs),
                "source": lambda: one_demo(root, "source", from_source, faults, runs),
            },
            args.rounds,
        )
        if any(empty_prefix.iterdir()):
            raise SystemExit(f"the from-source side wrote bytecode under {empty_prefix}: B was not the venv as it was")
    goodput = {side: [r["goodput"] for r in rows] for side, rows in results.items()}
    ratio, pairs = paired_ratio(goodput["compiled"], goodput["source"])
    medians = {side: statistics.median(values) for side, values in goodput.items()}
    walls = {side: statistics.median(r["wall_s"] for r in rows) for side, rows in results.items()}
    print(f"goodput compiled / from source: {ratio:.3f} ({medians['compiled']:.3f} vs {medians['source']:.3f})")
    write_result(
        "demo_goodput",
        ratio,
        GOAL,
        f"the same demo with every import compiled from source (the venv before `make setup` compiled it): "
        f"goodput {medians['compiled']:.3f} vs {medians['source']:.3f}, wall {walls['compiled']:.0f} s vs "
        f"{walls['source']:.0f} s median",
        " ".join(["python -m bench.micro.demo_goodput", *sys.argv[1:]]),
        {
            "demo_faults": faults,
            "goodput": goodput,
            "pair_ratios": pairs,
            "wall_s": walls,
            "runs": runs,
            "machine": machine_details(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
