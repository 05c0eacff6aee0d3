"""Goodput under preemption: real local runs hit by preemptions at random (Poisson), fixed vs auto interval.

Each run is ``spotray run --local`` of the GPT-2 job (2 Ray Train workers, embedded S3 server). A
preemption is a lost worker node without notice (``kill-worker``: SIGKILL to a Ray Train worker; Ray
Train restarts the worker group, which resumes from the latest complete checkpoint), or with
``--kind spot-notice`` a spot notice (an emergency checkpoint, then a new attempt). Preemptions
arrive as a Poisson process in steps: gaps drawn from an exponential distribution whose mean is
``interval / rate`` steps, so ``--rates 0.1`` is one preemption per ten (fixed) checkpoint intervals.
The fixed and the auto run of a rate get the same preemption steps, back to back.

For each run: goodput from the ledger of its event log (train/goodput.py: surviving step time over
wall time, wall from the first worker's start to the last event), the time lost by cause, and
whether every step trained exactly the batch of the uninterrupted run (the sample logs), which runs
first. Result: ``bench/results/goodput.json``; ratio: the goodput of the run at the first rate with
the first mode (auto by default: the product's setting; fixed is what it is compared
with) (goal >= 0.90).

Elastic worker counts (issue #16, item 1) are not built yet, so there is no elastic leg.

    .venv/bin/python -m bench.goodput            # make bench-goodput: 12,000 steps, interval 600 (~40 min)
    .venv/bin/python -m bench.goodput --steps 1500 --interval 50 --rates 0.1,0.2 --name goodput_short
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

from bench import chaos_runs
from bench.chaos_runs import Fault, RunResult
from bench.common import machine_details, write_result
from spotray.train.events import read_events
from spotray.train.goodput import Ledger, ledger, split_lifetimes

MANIFEST = """\
apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata:
  name: goodput-run
spec:
  entrypoint: python -m spotray.jobs.gpt2 --max-steps {steps} --batch-size 8 --workdir {{job_dir}}
  workers: {{{{replicas: 2, cpu: "1", memory: 2Gi, gpu: 0}}}}
  checkpoint: {{{{uri: "s3://chaos/runs/goodput-run", everySteps: {every}, minEverySteps: {low}, \
maxEverySteps: {high}, keep: 2}}}}
  data: {{{{uri: "s3://chaos/datasets/gpt2-bytes"}}}}
  retry: {{{{maxPreemptions: 50, maxFailures: 3, backoffSeconds: 1}}}}
"""


def manifest(steps: int, every: int | str, low: int, high: int) -> str:
    """The TrainingRun template for ``chaos_runs.run_local`` (which fills in ``{job_dir}``)."""
    return MANIFEST.format(steps=steps, every=every, low=low, high=high)


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


def describe(result: RunResult, reference: RunResult, faults: list[Fault]) -> dict[str, Any]:
    spent = run_ledger(result)
    return {
        "exit_code": result.exit_code,
        "preemption_steps": [fault.step for fault in faults],
        "injected": len(result.injected),
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
    parser.add_argument("--modes", default="auto,fixed", help="auto, fixed, or both; the first is the headline")
    parser.add_argument("--kind", default="kill-worker", choices=["kill-worker", "spot-notice"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", default="goodput", help="the result's name: bench/results/NAME.json")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    modes = args.modes.split(",")
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
        baseline = describe(reference, reference, [])
        print(f"uninterrupted: goodput {baseline['goodput']:.3f}, wall {baseline['wall_s']} s", flush=True)
        runs: list[dict[str, Any]] = []
        for rate in rates:
            steps = poisson_steps(random.Random(f"{args.seed}-{rate}"), args.interval / rate, 5, args.steps - 5)
            faults = [Fault(args.kind, step) for step in steps]
            for mode in modes:
                text = fixed if mode == "fixed" else manifest(args.steps, "auto", low, high)
                token = f"goodput-{rate}-{mode}-{os.getpid()}"
                result = chaos_runs.run_local(work / f"{rate}-{mode}", faults, token, None, text, timeout_s)
                row = {"rate": rate, "mode": mode, **describe(result, reference, faults)}
                row["relative_to_uninterrupted"] = round(row["goodput"] / baseline["goodput"], 4)
                runs.append(row)
                print(
                    f"rate {rate} {mode}: goodput {row['goodput']:.3f} ({row['relative_to_uninterrupted']:.2f} of "
                    f"uninterrupted), {row['injected']} preemption(s), {row['checkpoints']} checkpoint(s), "
                    f"lost {row['lost_s']}, same samples: {row['same_samples_as_uninterrupted']}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    headline = next(row for row in runs if row["mode"] == modes[0])
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
    command = "python -m bench.goodput " + " ".join(sys.argv[1:])
    path = write_result(
        args.name,
        headline["goodput"],
        ">= 0.90",
        f"{headline['mode']} checkpoint interval, {headline['rate']} preemptions per fixed interval of "
        f"{args.interval} steps; goodput = surviving step time / wall time (uninterrupted: {baseline['goodput']})",
        command.strip(),
        details,
    )
    print(f"wrote {path}")
    return 0 if details["all_same_samples"] else 1


if __name__ == "__main__":
    sys.exit(main())
