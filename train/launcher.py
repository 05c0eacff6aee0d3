"""The one place that knows Ray: a run spec becomes a Ray Train ``TorchTrainer`` run, and its end an exit code.

What each part of the spec becomes:
- ``workers`` -> ``ScalingConfig``: one training worker per GPU (``replicas x gpu``), or ``replicas``
  CPU workers, each asking for its share of the replica's CPUs;
- the run name -> ``RunConfig(name=...)``, stable across attempts, so Ray's run directory is reused;
- worker failures -> ``FailureConfig(max_failures=-1)`` by default: a worker process or node that
  dies is replaced and training goes on from the latest complete checkpoint in our store (seed 003).

Ray Train V2 (the default in Ray 2.60) has no ``TorchTrainer.restore``: a new attempt is a new
``fit()``, and resume comes from our own S3 checkpoints, which each worker fetches at start. We
never hand checkpoints to Ray (``ray.train.report`` carries metrics only), so Ray's storage path
holds only small run metadata and may be a local directory.

Exit codes, for the controller and local mode:
- 0: training finished;
- 143 (128 + SIGTERM): the attempt stopped on a preemption notice after its emergency checkpoint
  was complete in the store: start the next attempt. Rank 0 leaves a marker in the store when it
  stops on a notice (Ray Train hands the driver only checkpoint-attached metrics, and we attach
  no checkpoints to Ray), and the driver records every attempt's outcome there too, for the controller;
- 1: training failed; 2: bad input (the message says what to fix).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from spotray.train.checkpoint import attempt_outcome_key, preemption_marker_key
from spotray.train.errors import SpotrayError
from spotray.train.extras import extra_required
from spotray.train.runspec import RunContext
from spotray.train.store import ObjectStore, get_bytes_if_exists

with extra_required("ray"):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

log = logging.getLogger(__name__)

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PREEMPTED = 128 + signal.SIGTERM
# Ray Train polls for draining nodes every 5 s by default; a 15 s notice cannot spare that much.
RAY_TRAIN_SETTINGS = {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
# How long a preemption notice gives (GKE gives 15 s, AWS 120 s); the drain deadline we announce.
DEFAULT_GRACE_SECONDS = 15


def build_scaling_config(context: RunContext) -> ScalingConfig:
    workers = context.spec.workers
    resources: dict[str, float] = {"CPU": workers.cpu_per_worker}
    if workers.gpu:
        resources["GPU"] = 1
    return ScalingConfig(num_workers=workers.num_workers, use_gpu=workers.gpu > 0, resources_per_worker=resources)


def build_run_config(context: RunContext, storage_path: str, *, max_worker_failures: int = -1) -> RunConfig:
    return RunConfig(
        name=context.name,
        storage_path=storage_path,
        failure_config=FailureConfig(max_failures=max_worker_failures),
    )


def default_storage_path() -> str:
    """Ray's run metadata: the shared NFS path when the cluster has one, else a local directory."""
    return os.environ.get("SPOTRAY_RAY_STORAGE", str(Path(tempfile.gettempdir()) / "spotray-ray-results"))


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended: the exit code and what a person should read about it."""

    exit_code: int
    step: int | None
    detail: str


def outcome_after_fit(store: ObjectStore, attempt: int) -> AttemptOutcome:
    """A ``fit()`` that returned normally either finished or stopped on a notice (rank 0's marker says which)."""
    raw = get_bytes_if_exists(store, preemption_marker_key(attempt))
    if raw is None:
        return AttemptOutcome(EXIT_SUCCEEDED, None, "training finished")
    marker = json.loads(raw)
    return AttemptOutcome(
        EXIT_PREEMPTED, marker.get("step"), "stopped on a preemption notice after a complete emergency checkpoint"
    )


def write_attempt_marker(store: ObjectStore, context: RunContext, outcome: AttemptOutcome) -> None:
    """Record how the attempt ended next to the checkpoints, for the controller to read."""
    marker = {
        "run": context.name,
        "attempt": context.attempt,
        "exit_code": outcome.exit_code,
        "step": outcome.step,
        "detail": outcome.detail,
        "time": time.time(),
    }
    store.put_bytes(attempt_outcome_key(context.attempt), json.dumps(marker, sort_keys=True).encode())


def drain_nodes(node_ids: list[str], reason_message: str, grace_seconds: int) -> int:
    """Tell Ray these nodes are being preempted; returns how many accepted the drain.

    Ray Train passes the notice to the workers through ``ray.train.get_preemption_info``; they take
    an emergency checkpoint and stop.
    """
    from ray.core.generated import autoscaler_pb2  # noqa: PLC0415 (generated protobufs, only needed here)

    # The same GCS call `ray drain-node` makes; Ray ships no typed public API for it.
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)  # type: ignore[attr-defined]
    deadline_ms = int(time.time() * 1000) + grace_seconds * 1000
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")  # type: ignore[attr-defined]
    accepted = 0
    for node_id in node_ids:
        ok, _ = gcs.drain_node(node_id, reason, reason_message, deadline_ms)
        accepted += int(ok)
    return accepted


def drain_all_nodes(reason_message: str, grace_seconds: int) -> int:
    """Drain every live node: what the driver does with its own SIGTERM (the whole cluster is going)."""
    alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    return drain_nodes(alive, reason_message, grace_seconds)


def spotray_env_for_workers(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's ``SPOTRAY_*`` settings (run context, event log), which the workers need too.

    S3 credentials are deliberately not among them: workers get those from their own environment
    (the pod's env from a Secret, or the local cluster's), never through Ray, whose dashboard shows
    a job's runtime_env to anyone who can open it.
    """
    source = os.environ if environ is None else environ
    return {key: value for key, value in source.items() if key.startswith("SPOTRAY_")}


def driver_env_vars(wanted: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """``wanted`` minus what the Ray job's own runtime env already sets.

    Under a Ray job (a RayJob's entrypoint) the job's runtime env, which already carries
    ``SPOTRAY_RUN``, is merged with ``ray.init``'s, and Ray refuses any key set in both.
    """
    raw = (os.environ if environ is None else environ).get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return wanted
    job_env = (json.loads(raw).get("runtime_env") or {}).get("env_vars") or {}
    return {key: value for key, value in wanted.items() if key not in job_env}


def install_sigterm_drain(grace_seconds: int) -> None:
    """On SIGTERM (the driver's own spot notice), drain the cluster instead of dying on the spot."""

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        log.warning("SIGTERM: asking the workers for an emergency checkpoint within %d s", grace_seconds)
        drained = drain_all_nodes("spotray: SIGTERM received by the driver", grace_seconds)
        log.warning("%d node(s) draining", drained)

    signal.signal(signal.SIGTERM, on_sigterm)


def launch(
    train_loop: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    context: RunContext,
    store: ObjectStore,
    *,
    storage_path: str | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    datasets: dict[str, Any] | None = None,
) -> int:
    """Run ``train_loop`` on every worker of a Ray Train run for this attempt; return the exit code.

    ``datasets`` (Ray Data datasets by name, or functions that build them, which Ray Train calls
    when each worker group starts) are split across the workers; each worker reads its part with
    ``ray.train.get_dataset_shard(name)``.
    """
    if not ray.is_initialized():
        # RAY_ADDRESS is set by the RayJob (KubeRay) and by local mode; without it Ray starts its own.
        ray.init(
            address=os.environ.get("RAY_ADDRESS"),
            logging_level=logging.WARNING,
            runtime_env={"env_vars": driver_env_vars({**spotray_env_for_workers(), **RAY_TRAIN_SETTINGS})},
        )
    install_sigterm_drain(grace_seconds)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=loop_config,
        scaling_config=build_scaling_config(context),
        run_config=build_run_config(context, storage_path or default_storage_path()),
        datasets=datasets,
    )
    try:
        trainer.fit()
    except SpotrayError as error:
        print(f"error: {error}", file=sys.stderr)
        outcome = AttemptOutcome(EXIT_BAD_INPUT, None, error.problem)
    except Exception as error:  # noqa: BLE001 (any training failure ends the attempt with a clear code)
        print(f"error: training failed: {error}", file=sys.stderr)
        outcome = AttemptOutcome(EXIT_FAILED, None, f"training failed: {type(error).__name__}: {error}")
    else:
        outcome = outcome_after_fit(store, context.attempt)
    try:
        write_attempt_marker(store, context, outcome)
    except SpotrayError as error:
        log.warning("could not record the attempt's outcome in the store: %s", error)
    return outcome.exit_code
