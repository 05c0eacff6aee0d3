"""Local mode's restarts, A vs B: a new Ray cluster for every attempt, or the one left standing (issue 39).

Each round runs `make demo`'s run twice, back to back, in alternating order: `spotray run
jobs/gpt2/trainingrun.yaml --local` with the demo's faults (a worker SIGKILLed, the head lost, a
spot notice), once with ``--fresh-ray-cluster`` (A: every attempt starts Ray, as before issue 39)
and once without (B: the attempt after the notice runs on the cluster still standing; the head loss
needs a new one either way).

For each new attempt it reads where the time went from the run's event log: from the last step of
the attempt before to the attempt being begun (the end noticed, judged, the emergency checkpoint),
Ray's start (none when kept), the driver until its workers are up (imports, Ray Train's worker
group), the workers until the training loop (model, checkpoint fetch), and the loop until its first
step. Ratio: the seconds from the last step before the notice's restart to the first step after it,
B over A (median over rounds); goal < 1. The goodput line of each run is in the details.

    .venv/bin/python -m bench.local_recovery            # 2 rounds, about 12 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine_details, scratch_dir, write_result
from spotray.train.records.events import read_events
from spotray.train.records.goodput import ledger, split_lifetimes

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "jobs" / "gpt2" / "trainingrun.yaml"
DEMO_FAULTS = ["--kill-worker-at", "50", "--kill-all-at", "110", "--preempt-at", "150"]  # the Makefile's
MODES = {"fresh": ["--fresh-ray-cluster"], "kept": []}


def attempt_phases(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each attempt after the first spent its start-up, from the run's event log."""
    phases = []
    last_step_at: float | None = None
    begun: dict[str, Any] | None = None
    worker_up = loop_start = None
    for event in events:
        kind, at = event["event"], float(event["time"])
        if kind == "attempt_begun":
            begun, worker_up, loop_start = event, None, None
        elif kind == "worker_start" and begun is not None and worker_up is None:
            worker_up = at
        elif kind == "start" and begun is not None and loop_start is None:
            loop_start = at
        elif kind == "step":
            if begun is not None and begun["attempt"] > 1 and last_step_at is not None and worker_up and loop_start:
                phases.append(
                    {
                        "attempt": begun["attempt"],
                        "ray_cluster": begun["ray_cluster"],
                        "end_to_next_attempt_s": round(float(begun["time"]) - last_step_at, 2),
                        "ray_start_s": begun["ray_start_s"],
                        "driver_to_workers_up_s": round(worker_up - float(begun["time"]) - begun["ray_start_s"], 2),
                        "workers_up_to_loop_s": round(loop_start - worker_up, 2),
                        "loop_to_first_step_s": round(at - loop_start, 2),
                        "last_step_to_first_step_s": round(at - last_step_at, 2),
                    }
                )
            if begun is not None and begun["attempt"] > 1 and worker_up and loop_start:
                begun = None  # this attempt's first step is counted
            last_step_at = at
    return phases


def one_run(root: Path, mode: str, index: int) -> dict[str, Any]:
    workdir = root / f"{mode}-{index}"
    command = [sys.executable, "-m", "spotray.cli", "run", str(MANIFEST), "--local", "--workdir", str(workdir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}  # the embedded S3, as make demo
    started = time.monotonic()
    result = subprocess.run(
        [*command, *DEMO_FAULTS, *MODES[mode]], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{mode} run {index} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    events = list(read_events(workdir / "events.jsonl"))
    lifetimes, first, last = split_lifetimes(events)
    spent = ledger(lifetimes, first or 0.0, last or 0.0)
    phases = attempt_phases(events)
    notice = next(p for p in phases if p["attempt"] == 3)  # attempt 3 follows the spot notice
    summary = {
        "mode": mode,
        "wall_s": round(wall, 1),
        "goodput": round(spent.goodput, 4),
        "restarts_s": round(spent.lost_s["restarts"], 1),
        "notice_restart_s": notice["last_step_to_first_step_s"],
        "attempts": phases,
        "time_line": spent.summary(),
    }
    print(f"  {mode} {index}: {summary['time_line']}; after the notice {notice}", flush=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with scratch_dir("spotray-bench-local-recovery-") as root:
        for index in range(1, args.rounds + 1):
            order = ["fresh", "kept"] if index % 2 else ["kept", "fresh"]  # drift falls on both alike
            runs += [one_run(root, mode, index) for mode in order]

    def median(mode: str, key: str) -> float:
        return statistics.median(float(run[key]) for run in runs if run["mode"] == mode)

    ratio = median("kept", "notice_restart_s") / median("fresh", "notice_restart_s")
    details = {
        "rounds": args.rounds,
        "faults": " ".join(DEMO_FAULTS),
        "notice_restart_s": {mode: median(mode, "notice_restart_s") for mode in MODES},
        "goodput": {mode: median(mode, "goodput") for mode in MODES},
        "restarts_s": {mode: median(mode, "restarts_s") for mode in MODES},
        "wall_s": {mode: median(mode, "wall_s") for mode in MODES},
        "runs": runs,
        **machine_details(),
    }
    write_result(
        "local_recovery",
        ratio,
        "< 1.0",
        "the same demo run with a new Ray cluster for every attempt (--fresh-ray-cluster): last step before "
        "the spot notice's restart to the first step after it",
        "python -m bench.local_recovery",
        details,
    )
    print(
        f"after a notice, kept / fresh cluster: {ratio:.3f} "
        f"({details['notice_restart_s']['kept']:.1f} s vs {details['notice_restart_s']['fresh']:.1f} s); "
        f"goodput kept {details['goodput']['kept']:.3f}, fresh {details['goodput']['fresh']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
