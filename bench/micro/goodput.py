"""Goodput under preemption: real local runs hit by preemptions at random (Poisson): fixed vs auto
checkpoint interval, and elastic vs fixed worker count.

Each run is ``spotray run --local`` of the GPT-2 job (2 Ray Train workers, embedded S3 server). A
preemption is one of (``--kind``):

- ``kill-worker``: a Ray Train worker SIGKILLed, no notice; Ray Train restarts the worker group,
  which resumes from the latest complete checkpoint;
- ``spot-notice``: a spot notice (an emergency checkpoint, then a new attempt);
- ``lose-node``: a worker's whole Ray node SIGKILLed (local mode's ``--lose-worker-at``), whose
  capacity returns ``--capacity-back-s`` seconds later (``--add-worker-at``). A fixed-size run waits
  for it; an elastic one (``minReplicas: 1``) goes on with one worker and grows back. A node's life
  is a length of time (exponential, its mean the mean gap below at the uninterrupted run's step
  time), counted from when it came up: an elastic run trains on while the node is gone, so a loss
  in steps would often hit the node the moment it returned.

Preemptions arrive as a Poisson process in steps: gaps drawn from an exponential distribution whose
mean is ``interval / rate`` steps, so ``--rates 0.1`` is one preemption per ten (fixed) checkpoint
intervals. Every leg of a rate gets the same preemption steps (or node lifetimes), back to back. The legs (``--modes``):
``auto`` (the auto interval), ``fixed`` (the fixed interval and size), ``elastic`` (the fixed
interval, elastic size).

For each run: goodput from the ledger of its event log (train/records/goodput.py: surviving step time over
wall time, wall from the first worker's start to the last event), the time lost by cause, and
whether every step trained exactly the batch of the uninterrupted run (the sample logs), which runs
first. Result: ``bench/results/NAME.json``; ratio: the goodput of the first leg at the first rate
(goal >= 0.90), or with ``--modes elastic,fixed`` the fixed-size run's wall time over the elastic
one's (goal >= 1.0: the elastic run finishes first). Goodput counts a step trained by fewer workers as
surviving step time, however long it took, so between sizes the time to finish is what compares.

    .venv/bin/python -m bench.micro.goodput            # make bench-goodput: 12,000 steps, interval 600 (~40 min)
    .venv/bin/python -m bench.micro.goodput --steps 1500 --interval 50 --rates 0.1,0.2 --name goodput_short
    .venv/bin/python -m bench.micro.goodput --kind lose-node --modes elastic,fixed --steps 1500 --interval 50 \\
        --rates 0.1 --capacity-back-s 60 --name goodput_elastic     # make bench-goodput-elastic
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.campaigns import chaos_runs
from bench.campaigns.chaos_runs import Fault, RunResult
from bench.common import machine_details, write_result
from spotray.train.records.event_log import read_events
from spotray.train.records.goodput import Ledger, ledger, split_lifetimes

MANIFEST = """\
apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata:
  name: goodput-run
spec:
  entrypoint: python -m spotray.jobs.gpt2 --max-steps {steps} --batch-size 8 --workdir {{job_dir}}
  workers: {{{{replicas: 2, minReplicas: {min_replicas}, cpu: "1", memory: 2Gi, gpu: 0}}}}
  checkpoint: {{{{uri: "s3://chaos/runs/goodput-run", everySteps: {every}, minEverySteps: {low}, \
maxEverySteps: {high}, keep: 2}}}}
  data: {{{{uri: "s3://chaos/datasets/gpt2-bytes"}}}}
  retry: {{{{maxPreemptions: 50, maxFailures: 3, backoffSeconds: 1}}}}
"""


def manifest(steps: int, every: int | str, low: int, high: int, min_replicas: int = 2) -> str:
    """The TrainingRun template for ``chaos_runs.run_local`` (which fills in ``{job_dir}``)."""
    return MANIFEST.format(steps=steps, every=every, low=low, high=high, min_replicas=min_replicas)


def leg_manifest(mode: str, steps: int, interval: int, low: int, high: int) -> str:
    """The TrainingRun of one leg: ``auto`` interval, ``fixed`` interval and size, or ``elastic`` size."""
    if mode == "auto":
        return manifest(steps, "auto", low, high)
    return manifest(steps, interval, low, high, min_replicas=1 if mode == "elastic" else 2)


def node_lifetimes(rng: random.Random, mean_s: float, total_s: float) -> list[float]:
    """How long each worker node lives (seconds from coming up to its loss): exponential, enough for ``total_s``."""
    found: list[float] = []
    while sum(found) < total_s:
        found.append(round(rng.expovariate(1.0 / mean_s), 1))
    return found


def node_flags(lifetimes_s: list[float], capacity_back_s: float) -> tuple[str, ...]:
    """Local mode's flags: the node is lost after each lifetime and comes back ``capacity_back_s`` later."""
    if not lifetimes_s:
        return ()
    lives = ",".join(f"{life:g}s" for life in lifetimes_s)
    return ("--lose-worker-at", lives, "--add-worker-at", f"{capacity_back_s:g}s")


def poisson_steps(rng: random.Random, mean_gap: float, first: int, last: int) -> list[int]:
    """Preemption steps of a Poisson process with ``mean_gap`` steps between them, in [first, last)."""
    found: list[int] = []
    at = float(first)
    while True:
        at += rng.expovariate(1.0 / mean_gap)
        if at >= last:
            return found
        if round(at) not in found:  # one preemption a step: a second one there would land a step later
            found.append(round(at))


def run_ledger(result: RunResult) -> Ledger:
    lifetimes, first, last = split_lifetimes(read_events(result.workdir / "events.jsonl"))
    return ledger(lifetimes, first or 0.0, last or 0.0)


def describe(result: RunResult, reference: RunResult, schedule: dict[str, Any]) -> dict[str, Any]:
    """One run's figures; ``schedule``: the preemptions it was given (steps, or node lifetimes)."""
    spent = run_ledger(result)
    return {
        "exit_code": result.exit_code,
        **schedule,
        "injected": len(result.injected),
        "nodes_lost": sum(1 for what in result.injected if what.startswith("SIGKILL to the worker node")),
        "goodput": round(spent.goodput, 4),
        "wall_s": round(spent.wall_s, 1),
        "surviving_step_s": round(spent.surviving_step_s, 1),
        "lost_s": {cause: round(seconds, 1) for cause, seconds in spent.lost_s.items()},
        "steps_redone": list(spent.redone_per_resume),
        "restarts": spent.worker_restarts + spent.attempts - 1,
        "same_samples_as_uninterrupted": result.batches() == reference.batches(),
        "checkpoints": sum(1 for e in read_events(result.workdir / "events.jsonl") if e["event"] == "checkpoint_saved"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12_000, help="training steps of every run")
    parser.add_argument("--interval", type=int, default=600, help="the fixed checkpoint interval, in steps")
    parser.add_argument("--rates", default="0.1", help="preemptions per fixed checkpoint interval")
    parser.add_argument("--modes", default="auto,fixed", help="legs: auto, fixed, elastic; the first is the headline")
    parser.add_argument("--kind", default="kill-worker", choices=["kill-worker", "spot-notice", "lose-node"])
    parser.add_argument(
        "--capacity-back-s", type=float, default=90.0, help="lose-node: seconds until a lost node's capacity returns"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", default="goodput", help="the result's name: bench/results/NAME.json")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - {"auto", "fixed", "elastic"})
    if unknown:
        parser.error(f"--modes: unknown leg(s) {unknown}; choose from auto, fixed, elastic")
    low, high = max(1, args.interval // 5), args.interval * 10  # auto's bounds: a fifth to ten times the fixed one
    timeout_s = 60.0 + args.steps * 2.0
    work = Path(tempfile.mkdtemp(prefix="spotray-goodput-"))
    started = time.monotonic()
    try:
        fixed = manifest(args.steps, args.interval, low, high)
        reference = chaos_runs.run_local(work / "reference", [], f"goodput-ref-{os.getpid()}", None, fixed, timeout_s)
        if reference.exit_code != 0:
            print(f"the uninterrupted run failed:\n{reference.log_tail()}", file=sys.stderr)
            return 1
        baseline = describe(reference, reference, {})
        print(f"uninterrupted: goodput {baseline['goodput']:.3f}, wall {baseline['wall_s']} s", flush=True)
        runs: list[dict[str, Any]] = []
        for rate in rates:
            rng = random.Random(f"{args.seed}-{rate}")
            faults: list[Fault] = []
            flags: tuple[str, ...] = ()
            schedule: dict[str, Any]
            if args.kind == "lose-node":
                # A node's life is a length of time: the mean gap in steps at the uninterrupted step time.
                mean_life_s = args.interval / rate * baseline["surviving_step_s"] / args.steps
                lives = node_lifetimes(rng, mean_life_s, timeout_s)
                flags, schedule = node_flags(lives, args.capacity_back_s), {"node_lifetimes_s": lives}
            else:
                steps = poisson_steps(rng, args.interval / rate, 5, args.steps - 5)
                faults, schedule = [Fault(args.kind, step) for step in steps], {"preemption_steps": steps}
            for mode in modes:
                text = leg_manifest(mode, args.steps, args.interval, low, high)
                token = f"goodput-{rate}-{mode}-{os.getpid()}"
                result = chaos_runs.run_local(
                    work / f"{rate}-{mode}", faults, token, None, text, timeout_s, extra_args=flags
                )
                row = {"rate": rate, "mode": mode, **describe(result, reference, schedule)}
                if "node_lifetimes_s" in row:  # the lives this run used: those lost, and the one it ended in
                    row["node_lifetimes_s"] = row["node_lifetimes_s"][: row["nodes_lost"] + 1]
                row["relative_to_uninterrupted"] = round(row["goodput"] / baseline["goodput"], 4)
                runs.append(row)
                print(
                    f"rate {rate} {mode}: goodput {row['goodput']:.3f} ({row['relative_to_uninterrupted']:.2f} of "
                    f"uninterrupted), wall {row['wall_s']} s, {row['injected']} fault(s) injected, "
                    f"{row['checkpoints']} checkpoint(s), "
                    f"lost {row['lost_s']}, same samples: {row['same_samples_as_uninterrupted']}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    details = {
        **machine_details(),
        "steps": args.steps,
        "fixed_interval": args.interval,
        "auto_bounds": [low, high],
        "kind": args.kind,
        "uninterrupted": baseline,
        "runs": runs,
        "all_same_samples": all(row["same_samples_as_uninterrupted"] for row in runs),
        "seconds": round(time.monotonic() - started),
    }
    if args.kind == "lose-node":
        details["capacity_back_s"] = args.capacity_back_s
    command = "python -m bench.micro.goodput " + " ".join(sys.argv[1:])
    if modes[:2] == ["elastic", "fixed"]:
        elastic, fixed_size = (next(row for row in runs if row["mode"] == mode) for mode in modes[:2])
        ratio, goal = fixed_size["wall_s"] / elastic["wall_s"], ">= 1.0"  # the elastic run finishes first
        baseline_text = (
            f"wall time of a fixed-size run over an elastic one (minReplicas 1 of 2), {elastic['rate']} {args.kind} "
            f"preemptions per interval of {args.interval} steps; goodput elastic {elastic['goodput']}, "
            f"fixed {fixed_size['goodput']}, uninterrupted {baseline['goodput']}"
        )
    else:
        headline = next(row for row in runs if row["mode"] == modes[0])
        ratio, goal = headline["goodput"], ">= 0.90"
        baseline_text = (
            f"{headline['mode']} checkpoint interval, {headline['rate']} preemptions per fixed interval of "
            f"{args.interval} steps; goodput = surviving step time / wall time (uninterrupted: {baseline['goodput']})"
        )
    path = write_result(args.name, ratio, goal, baseline_text, command.strip(), details)
    print(f"wrote {path}")
    return 0 if details["all_same_samples"] else 1


if __name__ == "__main__":
    sys.exit(main())
