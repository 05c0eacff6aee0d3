"""A fixed-size run's worker node gets a spot notice, A vs B: with a spare worker pod, or without (issue 39).

The case: the GPT-2 example, two workers (a fixed size), one of them on a Ray node of its own that
local mode drains with a 30 s spot notice at step 20 (steps paced to 1 s; spotray/local/node_faults.py).
Each round runs it twice, back to back, in alternating order:

- A, ``spareReplicas: 1``: local mode starts a spare node once the group trains. At the notice rank
  0 reads Ray's free room outside the draining node (the spare), so every rank takes an emergency
  checkpoint and trains on; once it is safe the node goes, and Ray Train restarts the group at two
  workers, on the head and the spare, in the same attempt (train/hf/notice.py);
- B, no spare: the notice stops the group on its emergency checkpoint, the attempt ends as a
  preemption, and local mode's next attempt starts a driver and a worker group of two, which needs
  the node back: it returns 5 s after it is gone (as a new spot node joined 5 s after a reclaim on
  the real-pods test bed), or with a new Ray cluster if local mode does not keep the old one
  (spotray/local/local_run.py; the first run's B leg logged no return, so it got the node that way).

What the notice costs the run, read from its event log: from the moment the step the next group
resumes from was trained (the notice's emergency checkpoint), to the next group's first step. Ratio:
A over B (median over rounds); goal <= 0.5. The issue's goal on real pods, notice -> training again
<= 15 s with the head kept, is measured by bench/on_testbed/recovery_real_pods.py, not here.

    .venv/bin/python -m bench.micro.spare_notice             # 2 rounds, about 14 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from bench.common import alternating_rounds, paired_legs, scratch_dir, write_result

# The same run shape as the elastic notice's: 80 steps paced to 1 s, a checkpoint every 10, a 30 s notice.
from bench.micro.elastic_notice import GLOBAL_BATCH, NOTICE_S, SAVE_STEPS, STEP_SECONDS, STEPS, measure_loss

NAME = "spare_notice"
GOAL = "<= 0.5"
NOTICE_AT = 20
RETURN_AFTER = "5s"  # the lost node back this long after it is gone (the real-pods bed: 5 s)
MODES = {"spare": 1, "none": 0}


def spares_manifest(max_steps: int, spares: int, step_seconds: float = STEP_SECONDS) -> str:
    """A fixed-size GPT-2 TrainingRun of two workers with ``spares`` spare pods (a chaos_runs template)."""
    entrypoint = (
        f"python -m spotray.jobs.gpt2 --max-steps {max_steps} --batch-size {GLOBAL_BATCH}"
        f" --min-step-seconds {step_seconds}"
    )
    return f"""\
apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata:
  name: spare-run
spec:
  entrypoint: {entrypoint} --workdir {{job_dir}}
  workers: {{{{replicas: 2, spareReplicas: {spares}, cpu: "1", memory: 2Gi, gpu: 0}}}}
  checkpoint: {{{{uri: "s3://spares/runs/spare-run", everySteps: {SAVE_STEPS}, keep: 2}}}}
  data: {{{{uri: "s3://spares/datasets/gpt2-bytes"}}}}
  retry: {{{{maxPreemptions: 2, maxFailures: 1, backoffSeconds: 1}}}}
"""


def notice_args(notice_at: int = NOTICE_AT, return_after: str = RETURN_AFTER) -> tuple[str, ...]:
    return ("--lose-worker-at", str(notice_at), "--worker-notice-s", str(NOTICE_S), "--add-worker-at", return_after)


def run_once(scratch: Path, mode: str) -> dict[str, Any]:
    """One run in a new directory under ``scratch``: with a spare it stays in attempt 1, without it takes 2."""
    attempts = 1 if MODES[mode] else 2
    return measure_loss(scratch, NAME, mode, spares_manifest(STEPS, MODES[mode]), notice_args(), attempts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with scratch_dir("spotray-spare-notice-") as scratch:
        legs = alternating_rounds({mode: functools.partial(run_once, scratch, mode) for mode in MODES}, args.rounds)
    figure = "the notice's emergency checkpoint step trained -> the next worker group's first step"
    ratio, details = paired_legs(legs, "lost_s", figure)
    medians = details["medians_s"]
    write_result(
        NAME,
        ratio,
        GOAL,
        baseline=(
            f"the same fixed-size run (2 workers) without a spare, its worker node given a {NOTICE_S} s notice "
            f"at step {NOTICE_AT} and back {RETURN_AFTER} after it is gone (a new attempt); measured: {figure}; "
            f"median {medians['spare']:.1f} s with a spare vs {medians['none']:.1f} s without"
        ),
        command=" ".join(["python -m bench.micro.spare_notice", *(argv if argv is not None else sys.argv[1:])]),
        details={**details, "steps": STEPS, "save_steps": SAVE_STEPS, "step_seconds": STEP_SECONDS},
    )
    print(f"{NAME}: spare {medians['spare']} s vs none {medians['none']} s: ratio {ratio:.3f} (goal {GOAL})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
