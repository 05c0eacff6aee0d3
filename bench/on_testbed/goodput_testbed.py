"""Goodput on real pods: a TrainingRun through the chart's controller, KubeRay and Ray in real
containers, its spot worker node reclaimed at random, against the same run uninterrupted.

The cluster is testbed/cluster_demo.py's (docs/testbed.md, "Real pods"): two real kubelets (on-demand,
spot) running the image built from the Dockerfile, the chart installed with helm (controller and
MinIO as pods), the GPT-2 job on one CPU worker. Reclaims arrive as a Poisson process in steps, one
per ``1 / --rate`` checkpoint intervals on average: at each drawn step the node of the current
attempt's worker pod is reclaimed as a cloud reclaims a spot VM (a taint and its pods evicted with
their grace period, then kubelet, containers and network stopped and the Node deleted; a new node
joins 5 s later). The controller sees the attempt preempted and starts the next one, which resumes
from the latest complete checkpoint. Goodput is what a user reads: each run's ``status.goodput``
(surviving step time over wall time, from the first attempt's creation).

Result: ``bench/results/goodput_real_pods.json``; ratio: the goodput of the reclaimed run (goal >=
0.90, as for the local runs of bench/micro/goodput.py), the uninterrupted run's in the baseline.
``bench/results/goodput_testbed.json`` (0.799) is the same benchmark on the earlier kwok test bed,
where one Ray head on the host stood in for every pod.

    .venv/bin/python -m bench.on_testbed.goodput_testbed          # make bench-goodput-testbed
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import machine_details, write_result
from bench.micro.goodput import poisson_steps
from spotray.contract.names import ATTEMPT_LABEL, RUN_LABEL, SUCCEEDED, TERMINAL_PHASES
from spotray.contract.status import parse_date_time
from spotray.train.records.progress_log import AttemptProgress, read_run_progress
from spotray.train.storage.store import open_store
from testbed import cluster_demo
from testbed.cluster_demo import DemoCluster

POLL_S = 1.0


def status_time(text: str | None) -> float | None:
    """A time of the run's status (RFC 3339, spotray/contract/status.py) as unix seconds; None when unset."""
    return parse_date_time(text).timestamp() if text else None


def _moment(text: str | None) -> float:
    return status_time(text) or 0.0


def current_step(status: dict[str, Any]) -> int:
    """The step the running attempt reported, or -1 while it has reported none (or none runs)."""
    attempts = status.get("attempts") or []
    progress = status.get("progress") or {}
    if not attempts or attempts[-1].get("endTime") or not status.get("rayJob"):
        return -1
    if _moment(progress.get("updateTime")) < _moment(attempts[-1].get("startTime")):
        return -1  # an earlier attempt's progress, not yet replaced
    return int(progress.get("step") or 0)


def attempt_lines(status: dict[str, Any]) -> list[str]:
    """Each attempt of a run's status as "N: outcome (reason)", for a result's details."""
    return [f"{a['attempt']}: {a.get('outcome')} ({a.get('reason', '')})" for a in status.get("attempts") or []]


def ready_worker_pods(cluster: DemoCluster, status: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The current attempt's worker pods whose containers are all ready (Ray up on them)."""
    found = cluster_demo.pods(cluster.testbed, cluster_demo.NAMESPACE, cluster_demo.worker_pods_selector(status, name))
    return [
        pod
        for pod in found
        if pod["status"].get("containerStatuses") and all(c.get("ready") for c in pod["status"]["containerStatuses"])
    ]


@dataclass
class Reclaims:
    """What a leg's reclaimer did: the step of each reclaim, the moment of each notice (time.time()),
    and each notice -> the next attempt's first reported step. A run with spares goes on in its
    attempt: its seconds are read from the progress records afterwards (``first_group_after``)."""

    steps: list[int] = field(default_factory=list)
    notices: list[float] = field(default_factory=list)
    back_s: list[float] = field(default_factory=list)


def reclaim_at(
    cluster: DemoCluster,
    name: str,
    targets: list[int],
    stop: threading.Event,
    done: Reclaims,
    spares: int = 0,
    lose: str = "worker",
) -> None:
    """Reclaim the worker's node once the running attempt reaches each of ``targets`` in turn. With
    ``spares``, once its spares are Ready too, and the node of the pod that runs the Ray Train worker
    (a spare's node would cost nothing). ``lose`` head: the node of the attempt's Ray head instead
    (the chart placing heads on spot nodes)."""
    for target in targets:
        ready: list[dict[str, Any]] = []
        while not stop.is_set():
            status = cluster_demo.run_status(cluster.testbed, name)
            if status.get("phase") in TERMINAL_PHASES:
                return
            if current_step(status) >= target:
                if not spares:
                    break
                ready = ready_worker_pods(cluster, status, name)
                if len(ready) > spares:
                    break
            stop.wait(POLL_S)
        else:
            return
        node = None
        if lose == "head":
            heads = cluster_demo.pods(
                cluster.testbed, cluster_demo.NAMESPACE, cluster_demo.worker_pods_selector(status, name, "head")
            )
            node = next((pod["spec"].get("nodeName") for pod in heads if pod["status"].get("phase") == "Running"), None)
            if node is None:
                cluster_demo.say(f"{name}: no running head pod to reclaim the node of: no reclaim")
                return
        elif spares:
            node = cluster_demo.training_worker_node(cluster.testbed, ready)
            if node is None:
                cluster_demo.say("no worker pod says it runs the Ray Train worker: reclaiming the first one's node")
        done.steps.append(current_step(status))
        attempts = len(status.get("attempts") or [])
        noticed = cluster_demo.reclaim_worker_node(cluster.testbed, status, name, stop, node=node)
        done.notices.append(noticed)
        # Otherwise the run goes on in the same attempt, or it may: read from its progress afterwards.
        while not spares and lose == "worker" and not stop.is_set():
            status = cluster_demo.run_status(cluster.testbed, name)
            if len(status.get("attempts") or []) > attempts and current_step(status) >= 0:
                done.back_s.append(round(time.time() - noticed, 1))
                break
            if status.get("phase") in TERMINAL_PHASES:
                return
            stop.wait(POLL_S)


def first_group_after(history: list[AttemptProgress], moment: float) -> dict[str, Any]:
    """The first worker group started after ``moment`` (a new attempt's, or a restart inside one):
    seconds from ``moment`` to its first step, where it resumed, and the steps the old group trained
    past that (redone)."""
    starts = [(a.started, a, a.resumed_from) for a in history if a.started is not None]
    starts += [(at, a, step) for a in history for step, at in a.restarts]
    later = sorted((s for s in starts if s[0] > moment), key=lambda s: s[0])
    if not later:
        groups = [(a.attempt, a.started, a.restarts, a.last_step) for a in history]
        raise RuntimeError(
            f"no worker group started after the notice at {moment:.1f}: (attempt, started, restarts, last step)"
            f" {groups}"
        )
    started, attempt, resumed = later[0]
    first = next((p for p in attempt.points if p[2] >= started), None)
    if first is None:
        raise RuntimeError(f"attempt {attempt.attempt}'s group started after the notice logged no step")
    before = [p[0] for a in history for p in a.points if p[2] < moment]
    trained_after_notice = [p[0] for a in history for p in a.points if moment <= p[2] < started]
    last_old = max(before + trained_after_notice)
    return {
        "notice_to_training_again_s": round(first[2] - moment, 1),
        "notice_to_new_group_s": round(started - moment, 1),
        "new_group_in_attempt": attempt.attempt,
        "resumed_from": resumed,
        # As the records show: the old group's last few points may not have reached the store (its
        # writer flushes every few seconds) before its node went.
        "last_step_before_the_new_group": last_old,
        "steps_redone_recorded": None if resumed is None else max(last_old - resumed, 0),
    }


def rayjob_to_first_step(lost_seconds: dict[str, Any]) -> int | None:
    """Of a run with no reclaim: waitingForCapacity (RayJob created -> the workers run the loop) plus
    startUp (-> the first step). Of a reclaimed run, waitingForCapacity also holds each new attempt's."""
    parts = [lost_seconds.get("waitingForCapacity"), lost_seconds.get("startUp")]
    return None if all(part is None for part in parts) else sum(int(part or 0) for part in parts)


def startup_phases(cluster: DemoCluster, name: str, status: dict[str, Any]) -> dict[str, float | None]:
    """Where a fresh start's time goes (issue #39, item 3): seconds from attempt 1's start (the
    controller creates its RayJob then; the RayJob itself may be gone: a run on a kept Ray cluster
    deletes its last one as it ends) to each milestone, from the objects' own timestamps (whole
    seconds: the API server's resolution), read while its pods are still there (KubeRay keeps a
    finished job's cluster for its TTL; a kept cluster's pods, which carry no attempt label, are not
    read).

    Pods: created, scheduled, container started, Ready (Ray up and its probes passing), head then
    worker. Then the ledger's: the workers run the training loop (waitingForCapacity ends: the driver
    submitted, Ray Train's worker group up) and the first step (startUp ends: imports, model,
    checkpoint fetch, data).
    """
    bed = cluster.testbed
    created = _moment((status.get("attempts") or [{}])[0].get("startTime"))
    lost_seconds = (status.get("goodput") or {}).get("lostSeconds") or {}

    def since(moment: str | None) -> float | None:
        return None if moment is None else round(_moment(moment) - created, 1)

    phases: dict[str, float | None] = {}
    for node_type in ("head", "worker"):
        selector = f"{RUN_LABEL}={name},{ATTEMPT_LABEL}=1,ray.io/node-type={node_type}"
        pods = cluster_demo.pods(bed, cluster_demo.NAMESPACE, selector)
        if not pods:
            phases[f"{node_type} pod gone"] = None
            continue
        pod = pods[0]
        conditions = {c["type"]: c.get("lastTransitionTime") for c in pod["status"].get("conditions") or []}
        container = (pod["status"].get("containerStatuses") or [{}])[0]
        running = (container.get("state") or {}).get("running") or {}
        phases[f"{node_type} pod created"] = since(pod["metadata"]["creationTimestamp"])
        phases[f"{node_type} scheduled"] = since(conditions.get("PodScheduled"))
        phases[f"{node_type} container started"] = since(running.get("startedAt"))
        phases[f"{node_type} ready"] = since(conditions.get("Ready"))
    waiting = lost_seconds.get("waitingForCapacity")
    phases["workers run the training loop"] = None if waiting is None else float(waiting)
    phases["first step"] = None if waiting is None else float(waiting + (lost_seconds.get("startUp") or 0))
    return phases


def spare_recoveries(cluster: DemoCluster, document: dict[str, Any], notices: list[float]) -> list[float | None]:
    """Each notice -> the first step of the first worker group started after it, from the run's
    progress records in MinIO (the pods share this machine's clock); None where none started."""
    os.environ.update(cluster.s3_env)  # this machine reads the run's progress from MinIO
    history = read_run_progress(open_store(document["spec"]["checkpoint"]["uri"], checkpoint_key=None))
    found: list[float | None] = []
    for noticed in notices:
        try:
            found.append(first_group_after(history, noticed)["notice_to_training_again_s"])
        except RuntimeError:
            found.append(None)
    return found


def run_leg(
    cluster: DemoCluster,
    workdir: Path,
    name: str,
    steps: int,
    interval: int,
    reclaims: list[int],
    timeout_s: float,
    min_step_seconds: float = 0.0,
    spares: int = 0,
    lose: str = "worker",
) -> dict[str, Any]:
    document = cluster_demo.demo_training_run(
        f"{cluster_demo.POD_JOB_DIR}/{name}",
        name=name,
        steps=steps,
        every=interval,
        max_preemptions=len(reclaims) + 3,
        min_step_seconds=min_step_seconds,
        spares=spares,
    )
    manifest = workdir / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))
    cluster.testbed.kubectl("apply", "-f", str(manifest))
    stop = threading.Event()
    done = Reclaims()
    reclaiming = (cluster, name, reclaims, stop, done, spares, lose)
    reclaimer = threading.Thread(target=reclaim_at, args=reclaiming, daemon=True)
    reclaimer.start()
    started = time.monotonic()
    status: dict[str, Any] = {}
    while time.monotonic() - started < timeout_s:
        status = cluster_demo.run_status(cluster.testbed, name)
        if status.get("phase") in TERMINAL_PHASES:
            break
        time.sleep(2)
    stop.set()
    reclaimer.join()
    time.sleep(4)  # one more status refresh (every 2 s): the ledger of the finished run
    status = cluster_demo.run_status(cluster.testbed, name)
    goodput = status.get("goodput") or {}
    phases = startup_phases(cluster, name, status) if not reclaims else None
    in_progress = spares or lose != "worker"
    back_s = spare_recoveries(cluster, document, done.notices) if in_progress else done.back_s
    return {
        "name": name,
        "phase": status.get("phase"),
        "attempts": attempt_lines(status),
        "reclaims_planned_at_steps": reclaims,
        "reclaimed_at_steps": done.steps,
        "spares": spares,
        "goodput": goodput.get("ratio"),
        "wall_s": goodput.get("wallSeconds"),
        "surviving_step_s": goodput.get("survivingStepSeconds"),
        "lost_s": goodput.get("lostSeconds"),
        "steps_redone": goodput.get("stepsRedone"),
        # RayJob created -> first step: the ledger's time waiting for the workers to run (nodes, pods,
        # Ray) plus the first attempt's start-up in them; and each reclaim notice -> training again.
        "rayjob_to_first_step_s": rayjob_to_first_step(goodput.get("lostSeconds") or {}),
        "notice_to_training_again_s": back_s,
        "notices_at": done.notices,  # unix seconds: when each reclaim's notice was given
        "checkpoint_uri": document["spec"]["checkpoint"]["uri"],
        # A fresh start, phase by phase: seconds from attempt 1's start (startup_phases).
        "startup_phases_s": phases,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="training steps of each run")
    parser.add_argument("--interval", type=int, default=300, help="checkpoint interval, in steps")
    parser.add_argument("--rate", type=float, default=0.1, help="reclaims per checkpoint interval, on average")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--reclaim-at", type=int, action="append", help="reclaim at this step (repeatable) instead of at random"
    )
    parser.add_argument("--name", default="goodput_real_pods", help="the result's name: bench/results/NAME.json")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-goodput-testbed", help="work directory"
    )
    args = parser.parse_args()
    reclaims = args.reclaim_at or poisson_steps(
        random.Random(args.seed), args.interval / args.rate, args.interval // 2, args.steps - 5
    )
    if not reclaims:
        parser.error(f"seed {args.seed} draws no reclaim before step {args.steps}: pick another --seed")
    timeout_s = 600.0 + args.steps * 0.5
    workdir = args.dir.resolve()
    runs = []
    with cluster_demo.as_supervisor(workdir), cluster_demo.demo_cluster(workdir) as cluster:
        for name, planned in (("uninterrupted", []), ("reclaimed", reclaims)):
            cluster_demo.say(f"{name}: {args.steps} steps, a checkpoint every {args.interval}, reclaims at {planned}")
            row = run_leg(cluster, workdir, name, args.steps, args.interval, planned, timeout_s)
            print(json.dumps(row), flush=True)
            runs.append(row)
    uninterrupted, reclaimed = runs
    if reclaimed["phase"] != SUCCEEDED or uninterrupted["phase"] != SUCCEEDED or reclaimed["goodput"] is None:
        print("a run did not succeed, or reported no goodput: no result written", file=sys.stderr)
        return 1
    details = {
        **machine_details(),
        "steps": args.steps,
        "interval": args.interval,
        "rate_per_interval": args.rate,
        "seed": args.seed,
        "runs": runs,
    }
    baseline = (
        f"the same run uninterrupted on real pods (goodput {uninterrupted['goodput']}); reclaims of the worker's "
        f"spot node at {args.rate} per checkpoint interval of {args.interval} steps; goodput from status.goodput"
    )
    command = "python -m bench.on_testbed.goodput_testbed " + " ".join(sys.argv[1:])
    path = write_result(args.name, float(reclaimed["goodput"]), ">= 0.90", baseline, command.strip(), details)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
