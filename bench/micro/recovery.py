"""Recovery from a worker SIGKILL, and the emergency checkpoint on a spot notice (SIGTERM), on real Ray.

One run of the GPT-2 job (2 Ray Train workers, local Ray cluster, SeaweedFS) per round:

- worker_recovery: the driver starts; seconds to its first completed step is the *cold start*. At
  ``--kill-at`` a Ray Train worker gets SIGKILL; seconds from the kill to the next completed step
  (Ray notices, restarts the worker group, every rank fetches the latest complete checkpoint from
  S3 and resumes) is the *recovery*. Ratio: recovery / cold start, median over rounds. Goal <= 1.5.
  Steps lost (kill step minus resume step) must stay within one checkpoint interval.
- sigterm_checkpoint: later in the same run the driver gets SIGTERM (what a spot notice or a pod
  deletion sends). Seconds from the signal to the emergency checkpoint being complete in S3,
  divided by a 15 s grace period (GKE's). Goal <= 0.5.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_details, write_result
from bench.micro.jobs import PYTHON, gpt2_command, python_env, start, wait_for_event
from spotray.contract.uris import parse_uri
from spotray.jobs.gpt2.data import MDS_COLUMNS, mds_samples
from spotray.local.local_ray import LocalRayCluster
from spotray.train.records.event_log import read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.mds_dataset import ensure_dataset
from spotray.train.storage.store import S3ObjectStore

BUCKET = "bench-recovery"
GRACE_S = 15.0


def one_round(root: Path, env: dict[str, str], index: int, args: argparse.Namespace) -> dict[str, Any]:
    workdir = root / f"round-{index}"
    workdir.mkdir()
    events = workdir / "events.jsonl"
    command = [
        PYTHON,
        *gpt2_command(
            f"s3://{BUCKET}/round-{index}",
            f"s3://{BUCKET}/data",
            workdir,
            workers=2,
            max_steps=100_000,
            save_steps=args.save_steps,
        ),
    ]
    started = time.time()
    child = start(command, env, workdir / "job.log")
    try:
        first = wait_for_event(events, lambda e: e["event"] == "step", child)
        cold_start = first["time"] - started

        at_kill = wait_for_event(events, lambda e: e["event"] == "step" and e["step"] >= args.kill_at, child)
        worker = max(
            (e for e in read_events(events) if e["event"] == "worker_start"), key=lambda e: (e["time"], e["rank"])
        )
        killed = time.time()
        os.kill(worker["pid"], signal.SIGKILL)
        restart = wait_for_event(events, lambda e: e["event"] == "start", child, after=killed)
        next_step = wait_for_event(events, lambda e: e["event"] == "step", child, after=killed)
        recovery = next_step["time"] - killed
        steps_lost = at_kill["step"] - (restart["resumed_from"] or 0)

        wait_for_event(events, lambda e: e["event"] == "step" and e["step"] >= restart["resumed_from"] + 20, child)
        signalled = time.time()
        child.send_signal(signal.SIGTERM)
        emergency = wait_for_event(events, lambda e: e["event"] == "emergency_checkpoint", child, after=signalled)
        complete = wait_for_event(
            events,
            lambda e: e["event"] == "checkpoint_complete" and e["step"] == emergency["step"],
            child,
            after=signalled,
        )
        exit_code = child.wait(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    result = {
        "cold_start_s": round(cold_start, 2),
        "recovery_s": round(recovery, 2),
        "killed_at_step": at_kill["step"],
        "resumed_from": restart["resumed_from"],
        "steps_lost": steps_lost,
        "sigterm_to_complete_checkpoint_s": round(complete["time"] - signalled, 2),
        "emergency_checkpoint_step": emergency["step"],
        "checkpoint_bytes": complete["bytes"],
        "driver_exit_code": exit_code,
    }
    print(f"  round {index}: {result}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotray-bench-recovery-") as tmp:
        root = Path(tmp)
        with LocalS3Server(root / "s3") as server:
            server.create_bucket(BUCKET)
            # The dataset is written before round 1, so no cold start includes preparing it.
            data_store = S3ObjectStore(parse_uri(f"s3://{BUCKET}/data"), server.config)
            ensure_dataset(data_store, lambda: mds_samples(128), MDS_COLUMNS)
            rounds = []
            for index in range(1, args.rounds + 1):
                # A cluster per round: the SIGTERM at the end of a round drains every node of its
                # cluster, and a drained node takes no new work (a new attempt gets a new cluster
                # on Kubernetes and in local mode, too).
                with LocalRayCluster(num_cpus=2, log_path=root / "ray.log", env=server.env()) as cluster:
                    env = python_env({**server.env(), "RAY_ADDRESS": cluster.address})
                    rounds.append(one_round(root, env, index, args))
    recovery_ratio = statistics.median(r["recovery_s"] / r["cold_start_s"] for r in rounds)
    sigterm_ratio = statistics.median(r["sigterm_to_complete_checkpoint_s"] for r in rounds) / GRACE_S
    details = {"rounds": rounds, "save_steps": args.save_steps, "workers": 2, **machine_details()}
    write_result(
        "worker_recovery",
        recovery_ratio,
        "<= 1.5",
        "a cold start of the same job: driver process start to its first completed step",
        "python -m bench.micro.recovery",
        {**details, "max_steps_lost": max(r["steps_lost"] for r in rounds)},
    )
    write_result(
        "sigterm_checkpoint",
        sigterm_ratio,
        "<= 0.5",
        f"a {GRACE_S:.0f} s grace period (GKE's spot notice); SIGTERM to a complete checkpoint in S3",
        "python -m bench.micro.recovery",
        {**details, "checkpoint_bytes": rounds[-1]["checkpoint_bytes"]},
    )
    print(f"worker recovery / cold start: {recovery_ratio:.3f}; SIGTERM to checkpoint / 15 s: {sigterm_ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
