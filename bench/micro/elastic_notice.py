"""An elastic run loses a worker node, A vs B: with a spot notice first, or without (issue 39, item 2).

The case: the GPT-2 example, two workers with ``minReplicas: 1``, one of them on a Ray node of its
own that local mode takes away at step 20 (steps paced to 1 s) (spotray/local/node_faults.py).
Each round runs it twice, back to back, in alternating order:

- A, ``--worker-notice-s 30``: the node gets a spot notice, as a pod's preStop hook gives it (the
  node drained as a preemption); every rank takes an emergency checkpoint and trains on; once it is
  safe the node goes (SIGTERM), and Ray Train restarts the group on the worker left, from that
  checkpoint (train/hf/notice.py, train/processes/drain_handshake.py);
- B, no notice: the node vanishes (SIGKILL); Ray notices the dead node after its heartbeats are
  missed, and the group restarts from the latest periodic checkpoint.

What a loss costs the run, read from its event log: from the moment the step the smaller group
resumes from was trained, to the smaller group's first step. It holds the steps trained again, the
time until the loss is seen, and the restart. Ratio: A over B (median over rounds); goal <= 0.5.

Before this change an elastic run ended its attempt on any notice, and the next attempt started a
driver and a worker group from scratch; that is not rerun here (the code is gone), see
bench/results/local_recovery.json for what an attempt's start-up costs on this machine.

    .venv/bin/python -m bench.micro.elastic_notice             # 2 rounds, about 22 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.campaigns import chaos_runs
from bench.common import alternating_rounds, machine_details, paired_ratio, scratch_dir, write_result
from spotray.train.records.event_log import read_events

NAME = "elastic_notice"
GOAL = "<= 0.5"
STEPS = 80
SAVE_STEPS = 10
GLOBAL_BATCH = 8
LOSE_AT = 20
STEP_SECONDS = 1.0  # both modes: the notice's hook starts, and the smaller group has steps left to train
NOTICE_S = 30
MODES = {"notice": ("--worker-notice-s", str(NOTICE_S)), "vanish": ()}


def elastic_manifest(
    max_steps: int, global_batch: int = GLOBAL_BATCH, save_steps: int = SAVE_STEPS, step_seconds: float = 0.0
) -> str:
    """An elastic GPT-2 TrainingRun of two workers that goes on with one (a chaos_runs template).

    ``step_seconds``: each step at least this long (the job's ``--min-step-seconds``). Unpaced, the
    tiny model trains a step in about 0.2 s here, and a notice's hook (a new Python process that
    imports Ray, 10-20 s on 2 loaded cores) found the run already over.
    """
    pace = f" --min-step-seconds {step_seconds}" if step_seconds else ""
    entrypoint = f"python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size {global_batch}{pace}"
    return f"""\
apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata:
  name: elastic-run
spec:
  entrypoint: {entrypoint} --workdir {{job_dir}}
  workers: {{{{replicas: 2, minReplicas: 1, cpu: "1", memory: 2Gi, gpu: 0}}}}
  checkpoint: {{{{uri: "s3://elastic/runs/elastic-run", everySteps: {save_steps}, keep: 2}}}}
  data: {{{{uri: "s3://elastic/datasets/gpt2-bytes"}}}}
  retry: {{{{maxPreemptions: 2, maxFailures: 1, backoffSeconds: 1}}}}
"""


def loss_cost(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the first loss cost: from the resumed step's training to the smaller group's first step."""
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    if len(starts) < 2:
        raise RuntimeError(f"the run has {len(starts)} worker group(s): the loss did not restart it")
    first, second = starts[0], starts[1]
    resumed = events[second]["resumed_from"]
    old_steps = {int(e["step"]): float(e["time"]) for e in events[first:second] if e["event"] == "step"}
    new_first = next(e for e in events[second:] if e["event"] == "step")
    if resumed not in old_steps:
        raise RuntimeError(f"the smaller group resumed from step {resumed}, which the first group never logged")
    last_old = max(old_steps)
    return {
        "lost_s": round(float(new_first["time"]) - old_steps[resumed], 2),
        "resumed_from": resumed,
        "last_step_before": last_old,
        "steps_redone": last_old - resumed,
        "silent_s": round(float(events[second]["time"]) - old_steps[last_old], 2),  # no step until the new group
        "smaller_group_world_size": events[second]["world_size"],
    }


def measure_loss(
    scratch: Path, bench: str, mode: str, manifest_text: str, extra_args: tuple[str, ...], attempts: int = 1
) -> dict[str, Any]:
    """One local run with node faults in a new directory under ``scratch``, which must end Succeeded
    in its ``attempts``-th attempt; returns what its first loss cost (``loss_cost``)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch)) / "run"
    print(f"{mode}: running in {workdir}", flush=True)
    result = chaos_runs.run_local(
        workdir, [], f"{bench}-{os.getpid()}-{mode}", manifest_text=manifest_text, timeout_s=900, extra_args=extra_args
    )
    if result.exit_code != 0 or result.state.get("attempt") != attempts:
        raise RuntimeError(
            f"{mode}: exit {result.exit_code}, status {result.state} (expected attempt {attempts}):\n"
            f"{result.log_tail()}"
        )
    cost = loss_cost(list(read_events(result.workdir / "events.jsonl")))
    print(f"  {mode}: {cost}", flush=True)
    seconds = round(result.seconds, 1)
    return {"mode": mode, "attempts": attempts, "seconds": seconds, "injected": result.injected, **cost}


def run_once(scratch: Path, mode: str) -> dict[str, Any]:
    """One run in a new directory under ``scratch``."""
    manifest = elastic_manifest(STEPS, step_seconds=STEP_SECONDS)
    return measure_loss(scratch, NAME, mode, manifest, ("--lose-worker-at", str(LOSE_AT), *MODES[mode]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with scratch_dir("spotray-elastic-notice-") as scratch:
        by_mode = alternating_rounds({mode: functools.partial(run_once, scratch, mode) for mode in MODES}, args.rounds)
    runs = [{"round": index + 1, **run} for mode in MODES for index, run in enumerate(by_mode[mode])]
    notice = [r["lost_s"] for r in by_mode["notice"]]
    vanish = [r["lost_s"] for r in by_mode["vanish"]]
    ratio, per_round = paired_ratio(notice, vanish)
    write_result(
        NAME,
        ratio,
        GOAL,
        baseline=(
            f"the same elastic run (2 workers, minReplicas 1) whose worker node vanishes at step {LOSE_AT} "
            "without a notice (SIGKILL); measured: resumed step trained -> the smaller group's first step; "
            f"median {statistics.median(notice):.1f} s with a {NOTICE_S} s notice vs "
            f"{statistics.median(vanish):.1f} s without"
        ),
        command=" ".join(["python -m bench.micro.elastic_notice", *(argv if argv is not None else sys.argv[1:])]),
        details={
            **machine_details(),
            "per_round": per_round,
            "runs": runs,
            "steps": STEPS,
            "save_steps": SAVE_STEPS,
            "step_seconds": STEP_SECONDS,
        },
    )
    print(f"{NAME}: notice {notice} vs vanish {vanish}: ratio {ratio:.3f} (goal {GOAL})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
