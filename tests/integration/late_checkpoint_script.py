"""A job whose emergency checkpoint outlasts the drain deadline of its driver's own SIGTERM.

What nemesis trial 39 hit (seed 1): a spot notice whose checkpoint took 13.3 s against a 12.4 s
deadline. Its one worker waits for Ray Train's preemption notice, then "checkpoints" for
``checkpoint_s`` seconds (past the deadline) and records the preemption, as spotray's callback does
(train/hf/notice.py). Usage: python late_checkpoint_script.py READY CHECKPOINT_S GRACE_S MARGIN_S
"""

import sys
import time
from pathlib import Path
from typing import Any

import ray.train

from spotray.contract.attempts import AttemptId
from spotray.contract.spec import RunContext
from spotray.train.launch.launcher import launch
from spotray.train.records.attempt_records import write_preemption
from spotray.train.storage.store import open_store

STEP = 7  # the step the emergency checkpoint is of, had it been complete


def checkpoint_past_the_deadline(config: dict[str, Any]) -> None:
    context = RunContext.from_env()
    assert context is not None
    Path(config["ready"]).touch()
    while ray.train.get_preemption_info() is None:
        time.sleep(0.2)
    time.sleep(config["checkpoint_s"])  # the upload, slowed by a struggling store
    attempt = AttemptId(context.run_id, context.attempt)
    write_preemption(open_store(context.spec.checkpoint.uri), attempt, STEP, config["checkpoint_s"])


if __name__ == "__main__":
    ready, checkpoint_s, grace_s, margin_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    run = RunContext.from_env()
    assert run is not None, "SPOTRAY_RUN names the run"
    config = {"ready": ready, "checkpoint_s": checkpoint_s}
    store = open_store(run.spec.checkpoint.uri)
    code = launch(checkpoint_past_the_deadline, config, run, store, grace_seconds=grace_s, notice_margin_s=margin_s)
    sys.exit(code)
