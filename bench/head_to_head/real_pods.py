"""The head-to-head on real pods (issue 74, item 1): spotray against the setup a team would write from
Ray's and KubeRay's documentation, the same job under the same disruptions, legs alternated.

Legs, each the GPT-2 job (same model, batch, seed, step pace, checkpoint interval) on the test bed of
testbed/cluster_demo.py (real kubelets, KubeRay, the chart's controller and MinIO as pods):

- ``spotray``: a TrainingRun with the chart's defaults (one Ray cluster per attempt, no spare);
- ``ray-documented``: bench/head_to_head/ray_documented.py in a KubeRay RayJob (``backoffLimit``,
  its script in a ConfigMap as KubeRay's sample does, Ray Train's checkpoints on the same MinIO),
  in a namespace of its own with nothing of spotray in it; its pods carry one spotray label only
  because the chart's MinIO admits its runs' pods by it (a team's bucket would not ask);
- ``spotray-kept`` (``--legs``): the chart's defaults but for ``controller.rayClusterPerRun`` (a Ray
  cluster kept per run), the candidate for the chart's default;
- ``spotray-best`` (``--legs``): the configuration measured best so far, a Ray cluster kept per run
  and one spare worker pod (it needs a second spot node).

The ratio is the first leg's goodput over the second's, round by round (the first two legs alternate
which goes first): against ``ray-documented`` (goal >= 1.3) or, for ``--legs spotray-kept,spotray``,
between two of spotray's settings (goal >= 1.0: the chart's default decision), each under its own
result name unless ``--name`` says otherwise.

Disruptions, the same for every leg, set by step (each leg's own progress says when): the worker's
spot node reclaimed every ``--reclaim-every-minutes`` of training, half a period in (a taint, its
pods evicted through the Eviction API with their grace period: the notice; then the node gone and a
new one 5 s later), and once, half-way between the first two reclaims, the Ray head's pod evicted
(its node stays: the controller, MinIO and KubeRay's operator live there).

Figures per leg, from the same kind of record for both (spotray's progress records in the bucket,
and ray_documented.py's ``ProgressLog``: each worker group's start, the step it resumed from, every
step's time and loss): goodput = the time of the steps that survived (each step's time in the group
that trained it last) over the wall time from the leg's submission to its target step; steps redone
at each new worker group; the wall time to the target step; the final loss (mean of the last tenth
of the steps). ratio: the median over rounds of spotray's goodput / ray-documented's (goal >= 1.3,
fixed before the first run); spotray must never redo more than one checkpoint interval. Not measured
here: whether every sample was trained exactly once (B logs no sample ids; spotray's exact-resume
tests cover A).

    .venv/bin/python -m bench.head_to_head.real_pods [--minutes 30] [--rounds 1] \\
        [--legs spotray,ray-documented,spotray-best]          # make bench-head-to-head
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import testbed.cluster as tb
from bench.common import alternating_pairs, machine_details, write_result
from bench.on_testbed.goodput_long import leg_timeout_s, reclaim_steps
from bench.on_testbed.goodput_testbed import attempt_lines, current_step
from spotray.contract.names import SPOT_LABEL, SPOT_LABEL_ON_DEMAND, SPOT_LABEL_SPOT, SUCCEEDED, TERMINAL_PHASES
from spotray.train.records.progress_log import AttemptProgress, read_run_progress
from spotray.train.storage.store import open_store
from testbed import cluster_demo
from testbed.cluster_demo import DemoCluster

GOAL = ">= 1.3"
# Two of spotray's own settings (``--legs spotray-kept,spotray``): the chart's default decision. The
# kept cluster costs nothing more than the default, so it is worth being the default if it is at
# least as good (fixed before the first run, 2026-12-07).
SETTINGS_GOAL = ">= 1.0"
B_BASELINE = (
    "ray_documented.py in a KubeRay RayJob (backoffLimit, Ray Train FailureConfig(max_failures=-1), "
    "RayTrainReportCallback, storage on the same MinIO), the same job and disruptions, alternated"
)
SCRIPT = Path(__file__).with_name("ray_documented.py")
B_NAMESPACE = "ray-documented"
B_STORAGE = f"{cluster_demo.BUCKET}/ray-documented"  # Ray Train's storage_path: BUCKET/PREFIX
POLL_S = 2.0
LEGS = ("spotray", "ray-documented", "spotray-kept", "spotray-best")
KEPT_CLUSTER_LEGS = ("spotray-kept", "spotray-best")


@dataclass(frozen=True)
class Comparison:
    """What a list of legs measures: the first leg's goodput over the second's, round by round."""

    legs: tuple[str, ...]

    @property
    def against_ray_documented(self) -> bool:
        return self.legs[1] == "ray-documented"

    @property
    def goal(self) -> str:
        return GOAL if self.against_ray_documented else SETTINGS_GOAL

    @property
    def name(self) -> str:
        if self.against_ray_documented:
            return "head_to_head_real_pods"
        return "head_to_head_" + "_vs_".join(leg.replace("-", "_") for leg in self.legs[:2])

    @property
    def baseline(self) -> str:
        if self.against_ray_documented:
            return B_BASELINE
        return f"the same TrainingRun as the {self.legs[1]} leg, the same disruptions, alternated"

    def pair_ratios(self, rows: list[dict[str, Any]]) -> list[float]:
        first, second = ([r.get("goodput") for r in rows if r["kind"] == kind] for kind in self.legs[:2])
        return [a / b for a, b in zip(first, second, strict=False) if a and b]


def comparison(legs: list[str]) -> Comparison:
    """The comparison ``--legs`` asks for (ValueError naming --legs when it is not one)."""
    if len(legs) < 2 or len(set(legs)) != len(legs) or not set(legs) <= set(LEGS):
        raise ValueError(f"--legs names two or more different legs of {', '.join(LEGS)}, got {','.join(legs)}")
    return Comparison(tuple(legs))


@dataclass(frozen=True)
class Group:
    """One worker group's training: when it started, the step it resumed from, its (step, loss, time)."""

    started: float
    resumed_from: int | None
    points: tuple[tuple[int, float | None, float], ...]


def spotray_groups(history: list[AttemptProgress]) -> list[Group]:
    """spotray's progress records as worker groups: each attempt's first group, and one per restart in it."""
    groups = []
    for attempt in history:
        first = attempt.started if attempt.started is not None else min((p[2] for p in attempt.points), default=0.0)
        starts = sorted([(first, attempt.resumed_from), *((at, step) for step, at in attempt.restarts)])
        for index, (began, resumed) in enumerate(starts):
            ends = starts[index + 1][0] if index + 1 < len(starts) else float("inf")
            points = tuple(p for p in attempt.points if (began <= p[2] or index == 0) and p[2] < ends)
            groups.append(Group(began, resumed, points))
    return sorted(groups, key=lambda g: g.started)


def ray_documented_groups(records: list[dict[str, Any]]) -> list[Group]:
    """ray_documented.py's ProgressLog objects as worker groups."""
    groups = [
        Group(float(r["started"]), r.get("resumed_from"), tuple((int(s), loss, float(t)) for s, loss, t in r["points"]))
        for r in records
    ]
    return sorted(groups, key=lambda g: g.started)


def step_seconds(points: tuple[tuple[int, float | None, float], ...]) -> dict[int, float]:
    """Each step's seconds in one group: the time since the point before, shared by the steps between;
    the group's first step (which holds its start-up) gets the group's median."""
    found: dict[int, float] = {}
    for (step0, _, t0), (step1, _, t1) in itertools.pairwise(points):
        if step1 > step0:
            for step in range(step0 + 1, step1 + 1):
                found[step] = (t1 - t0) / (step1 - step0)
    if points and found:
        found.setdefault(points[0][0], statistics.median(found.values()))
    return found


def leg_figures(groups: list[Group], submitted: float, target: int) -> dict[str, Any]:
    """Goodput, steps redone at each new group, wall time to ``target`` and the final loss (module docstring)."""
    surviving: dict[int, float] = {}
    redone: list[int] = []
    for index, group in enumerate(groups):
        if index:
            before = [p[0] for g in groups[:index] for p in g.points if p[2] < group.started]
            redone.append(max(max(before, default=0) - (group.resumed_from or 0), 0))
        surviving.update(step_seconds(group.points))
    reached = [p[2] for g in groups for p in g.points if p[0] >= target]
    if not reached:
        return {"reached_target": False, "groups": len(groups), "steps_redone": redone}
    wall = min(reached) - submitted
    useful = sum(seconds for step, seconds in surviving.items() if step <= target)
    last = [p[1] for p in groups[-1].points if p[0] > 0.9 * target and p[1] is not None]
    return {
        "reached_target": True,
        "goodput": round(useful / wall, 4),
        "wall_to_target_s": round(wall, 1),
        "useful_step_s": round(useful, 1),
        "groups": len(groups),
        "steps_redone": redone,
        "final_loss": round(statistics.fmean(last), 4) if last else None,
    }


def disruption_schedule(steps: int, pace_s: float, every_minutes: float) -> list[tuple[int, str]]:
    """(step, what) in order: the worker's node reclaimed once a period, the head evicted once between
    the first two reclaims (or half-way to the first, when only one fits)."""
    reclaims = reclaim_steps(steps, pace_s, every_minutes * 60)
    if not reclaims:
        raise ValueError(f"no reclaim fits in {steps} steps of {pace_s:g} s at one per {every_minutes:g} minutes")
    head = (reclaims[0] + reclaims[1]) // 2 if len(reclaims) > 1 else reclaims[0] // 2
    return sorted([*((step, "worker") for step in reclaims), (head, "head")])


def ray_documented_manifests(name: str, steps: int, every: int, pace_s: float, image: str) -> list[dict[str, Any]]:
    """The B leg as a user of KubeRay's docs writes it: the script's ConfigMap and a RayJob whose cluster
    has its head on the on-demand node (``num-cpus: 0``, as KubeRay advises) and one CPU worker on spot."""
    env = [{"name": "AWS_ENDPOINT_URL", "value": "http://spotray-minio.spotray-system.svc.cluster.local:9000"}]
    env_from = [{"secretRef": {"name": cluster_demo.SECRET}}]
    # Only for the test bed: the chart's MinIO admits the pods of spotray's runs by this label.
    labels = {"app.kubernetes.io/managed-by": "spotray"}
    script = {"name": "script", "configMap": {"name": f"{name}-script"}}

    def container(kind: str, cpu: str, memory: str) -> dict[str, Any]:
        resources = {"cpu": cpu, "memory": memory}
        found: dict[str, Any] = {
            "name": f"ray-{kind}", "image": image, "imagePullPolicy": "Never", "env": env, "envFrom": env_from,
            "resources": {"requests": resources, "limits": resources},
        }  # fmt: skip
        if kind == "head":
            found["volumeMounts"] = [{"name": "script", "mountPath": "/home/ray/script"}]
        return found

    spot_toleration = {"key": tb.SPOT_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
    entrypoint = (
        f"python /home/ray/script/ray_documented.py --name {name} --storage {B_STORAGE} --max-steps {steps}"
        f" --every {every} --batch-size 8 --min-step-seconds {pace_s:g} --progress"
    )
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": B_NAMESPACE},
        "spec": {
            "entrypoint": entrypoint,
            "backoffLimit": 10,  # a new cluster and driver after a lost head; the driver resumes from storage
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 30,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {SPOT_LABEL: SPOT_LABEL_ON_DEMAND},
                            "containers": [container("head", "250m", "4Gi")],
                            "volumes": [script],
                        },
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "spot",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "nodeSelector": {SPOT_LABEL: SPOT_LABEL_SPOT},
                                "tolerations": [spot_toleration],
                                "containers": [container("worker", "500m", "3Gi")],
                            },
                        },
                    }
                ],
            },
        },
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-script", "namespace": B_NAMESPACE},
        "data": {"ray_documented.py": SCRIPT.read_text()},
    }
    return [config_map, rayjob]


def evict(cluster: DemoCluster, namespace: str, pod: str) -> None:
    """The pod evicted through the Eviction API (as a drain or a node-pressure eviction does)."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    cluster.testbed.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-",
                            stdin=json.dumps(eviction), check=False)  # fmt: skip


class Leg:
    """One leg's run: started, watched, disrupted, measured, deleted."""

    namespace = cluster_demo.NAMESPACE

    def __init__(self, cluster: DemoCluster, workdir: Path, name: str, steps: int, every: int, pace_s: float) -> None:
        self.cluster, self.workdir, self.name = cluster, workdir, name
        self.steps, self.every, self.pace_s = steps, every, pace_s
        self.submitted = 0.0

    def start(self) -> None:
        raise NotImplementedError

    def step(self) -> int:
        """The step the running group reported last (-1 before any)."""
        raise NotImplementedError

    def ended(self) -> str | None:
        """The run's end (Succeeded or Failed), None while it runs."""
        raise NotImplementedError

    def ray_pods(self, node_type: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def groups(self) -> list[Group]:
        raise NotImplementedError

    def outcome(self) -> dict[str, Any]:
        return {}

    def delete(self) -> None:
        raise NotImplementedError


class SpotrayLeg(Leg):
    def __init__(self, *args: Any, spares: int = 0) -> None:
        super().__init__(*args)
        self.spares = spares
        self.document = cluster_demo.demo_training_run(
            f"{cluster_demo.POD_JOB_DIR}/{self.name}", name=self.name, steps=self.steps, every=self.every,
            max_preemptions=20, min_step_seconds=self.pace_s, spares=spares,
        )  # fmt: skip

    def start(self) -> None:
        manifest = self.workdir / f"{self.name}.yaml"
        manifest.write_text(yaml.safe_dump(self.document, sort_keys=False))
        self.submitted = time.time()
        self.cluster.testbed.kubectl("apply", "-f", str(manifest))

    def status(self) -> dict[str, Any]:
        return cluster_demo.run_status(self.cluster.testbed, self.name)

    def step(self) -> int:
        return current_step(self.status())

    def ended(self) -> str | None:
        phase = self.status().get("phase")
        return str(phase) if phase in TERMINAL_PHASES else None

    def ray_pods(self, node_type: str) -> list[dict[str, Any]]:
        selector = cluster_demo.worker_pods_selector(self.status(), self.name, node_type)
        return cluster_demo.pods(self.cluster.testbed, self.namespace, selector)

    def groups(self) -> list[Group]:
        os.environ.update(self.cluster.s3_env)  # this machine reads the run's progress from MinIO
        store = open_store(self.document["spec"]["checkpoint"]["uri"], checkpoint_key=None)
        return spotray_groups(read_run_progress(store))

    def outcome(self) -> dict[str, Any]:
        status = self.status()
        goodput = status.get("goodput") or {}
        return {
            "attempts": attempt_lines(status),
            "status_goodput": goodput.get("ratio"),
            "status_steps_redone": goodput.get("stepsRedone"),
        }

    def delete(self) -> None:
        cluster_demo.delete_run(self.cluster.testbed, self.name)


class RayDocumentedLeg(Leg):
    namespace = B_NAMESPACE

    def start(self) -> None:
        image = tb.real.images_manifest()["spotray"]["ref"]
        self.submitted = time.time()
        self.cluster.testbed.apply(*ray_documented_manifests(self.name, self.steps, self.every, self.pace_s, image))

    def rayjob(self) -> dict[str, Any]:
        found = self.cluster.testbed.kubectl("get", "rayjob", self.name, "-n", B_NAMESPACE, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else {}

    def records(self) -> list[dict[str, Any]]:
        os.environ.update(self.cluster.s3_env)  # this machine reads the step log from MinIO
        store = open_store(f"s3://{B_STORAGE}/{self.name}", checkpoint_key=None)
        return [json.loads(store.get_bytes(found.key)) for found in store.list("bench-progress/")]

    def step(self) -> int:
        groups = ray_documented_groups(self.records())
        return groups[-1].points[-1][0] if groups and groups[-1].points else -1

    def ended(self) -> str | None:
        status = self.rayjob().get("status") or {}
        if status.get("jobStatus") == "SUCCEEDED":
            return SUCCEEDED
        return "Failed" if status.get("jobDeploymentStatus") == "Failed" else None

    def ray_pods(self, node_type: str) -> list[dict[str, Any]]:
        cluster = (self.rayjob().get("status") or {}).get("rayClusterName")
        if not cluster:
            return []
        selector = f"ray.io/cluster={cluster},ray.io/node-type={node_type}"
        return cluster_demo.pods(self.cluster.testbed, B_NAMESPACE, selector)

    def groups(self) -> list[Group]:
        return ray_documented_groups(self.records())

    def outcome(self) -> dict[str, Any]:
        status = self.rayjob().get("status") or {}
        return {"rayjob": {k: status.get(k) for k in ("jobStatus", "jobDeploymentStatus", "failed", "succeeded")}}

    def delete(self) -> None:
        bed = self.cluster.testbed
        bed.kubectl("delete", "rayjob", self.name, "-n", B_NAMESPACE, "--wait=false", check=False)
        tb.wait_until(
            f"the pods of RayJob {self.name} gone",
            lambda: not cluster_demo.pods(bed, B_NAMESPACE, "app.kubernetes.io/managed-by=spotray"),
            timeout=300,
            interval=2,
        )


def disrupt(leg: Leg, schedule: list[tuple[int, str]], stop: threading.Event, done: list[dict[str, Any]]) -> None:
    """Play ``schedule`` against the leg: at each step, reclaim the worker's node or evict the head."""
    bed = leg.cluster.testbed
    for target, what in schedule:
        while not stop.is_set() and leg.step() < target:
            if leg.ended():
                return
            stop.wait(POLL_S)
        if stop.is_set():
            return
        node_type = "head" if what == "head" else "worker"
        running = [p for p in leg.ray_pods(node_type) if p["status"].get("phase") == "Running"]
        if what == "worker" and isinstance(leg, SpotrayLeg) and leg.spares:
            node = cluster_demo.training_worker_node(bed, running)
        else:
            node = running[0]["spec"].get("nodeName") if running else None
        row = {"what": what, "planned_step": target, "step": leg.step(), "time": time.time(), "node": node}
        done.append(row)
        if not running or node is None:
            row["skipped"] = f"no running {node_type} pod"
            continue
        if what == "head":
            cluster_demo.say(f"{leg.name}: the head pod {running[0]['metadata']['name']} evicted at step {row['step']}")
            evict(leg.cluster, leg.namespace, running[0]["metadata"]["name"])
        else:
            cluster_demo.reclaim_worker_node(bed, {}, leg.name, stop, node=node)


def run_leg(leg: Leg, schedule: list[tuple[int, str]], timeout_s: float) -> dict[str, Any]:
    leg.start()
    stop, done = threading.Event(), list[dict[str, Any]]()
    disruptor = threading.Thread(target=disrupt, args=(leg, schedule, stop, done), daemon=True)
    disruptor.start()
    began = time.monotonic()
    ended = None
    while time.monotonic() - began < timeout_s and ended is None:
        time.sleep(POLL_S)
        ended = leg.ended()
    stop.set()
    disruptor.join()
    row = {
        "leg": leg.name,
        "ended": ended or f"still running after {timeout_s:.0f} s",
        "disruptions": done,
        **leg_figures(leg.groups(), leg.submitted, leg.steps),
        **leg.outcome(),
        "seconds": round(time.monotonic() - began, 1),
    }
    leg.delete()
    return row


def make_leg(kind: str, cluster: DemoCluster, workdir: Path, name: str, args: argparse.Namespace, steps: int) -> Leg:
    common = (cluster, workdir, name, steps, args.interval, args.min_step_seconds)
    if kind == "ray-documented":
        return RayDocumentedLeg(*common)
    cluster_demo.set_ray_cluster_per_run(cluster.testbed, kind in KEPT_CLUSTER_LEGS)
    return SpotrayLeg(*common, spares=1 if kind == "spotray-best" else 0)


def leg_order(legs: list[str], rounds: int) -> list[str]:
    """Rounds of every leg, the first two alternating which goes first, any third leg last in each round."""
    settings = [setting for setting, _ in alternating_pairs(rounds, legs[0], legs[1])]
    return [leg for pair in range(rounds) for leg in (*settings[2 * pair : 2 * pair + 2], *legs[2:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time asked of each leg")
    parser.add_argument("--min-step-seconds", type=float, default=0.5, help="each step's pace (both legs)")
    parser.add_argument("--reclaim-every-minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=int, default=120, help="checkpoint interval, in steps (both legs)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--legs", default="spotray,ray-documented", help=f"comma-separated, of {', '.join(LEGS)}")
    parser.add_argument(
        "--name", default=None, help="the result's name (head_to_head_real_pods against ray-documented)"
    )
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "spotray-head-to-head")
    args = parser.parse_args(argv)
    legs = args.legs.split(",")
    try:
        plan = comparison(legs)
    except ValueError as error:
        parser.error(str(error))
    args.name = args.name or plan.name
    steps = round(args.minutes * 60 / args.min_step_seconds)
    schedule = disruption_schedule(steps, args.min_step_seconds, args.reclaim_every_minutes)
    timeout_s = leg_timeout_s(steps, args.min_step_seconds, len(schedule))
    workdir = args.dir.resolve()
    rows: list[dict[str, Any]] = []
    spot_nodes = 2 if "spotray-best" in legs else 1
    with cluster_demo.as_supervisor(workdir), cluster_demo.demo_cluster(workdir, spot_nodes=spot_nodes) as cluster:
        cluster.testbed.kubectl("create", "namespace", B_NAMESPACE)
        keys = {k: cluster.s3_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        cluster.testbed.kubectl("create", "secret", "generic", cluster_demo.SECRET, "-n", B_NAMESPACE,
                                *(f"--from-literal={k}={v}" for k, v in keys.items()))  # fmt: skip
        order, exit_code = leg_order(legs, args.rounds), 1
        for index, kind in enumerate(order):
            leg = make_leg(kind, cluster, workdir, f"{kind}-{index}", args, steps)
            cluster_demo.say(f"leg {index}: {kind}, {steps} steps of {args.min_step_seconds:g} s, then {schedule}")
            row = {"kind": kind, **run_leg(leg, schedule, timeout_s)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            # After every leg, not only the last: a campaign of two hours that is cut short keeps
            # what it measured, and says how much of it there is (legs_run of legs_planned).
            exit_code = write_head_to_head(args, plan, rows, schedule, steps, legs_planned=len(order))
    return exit_code


def write_head_to_head(
    args: argparse.Namespace,
    plan: Comparison,
    rows: list[dict[str, Any]],
    schedule: list[Any],
    steps: int,
    legs_planned: int,
) -> int:
    goodput = {kind: [r.get("goodput") for r in rows if r["kind"] == kind] for kind in plan.legs}
    pairs = plan.pair_ratios(rows)
    redone = [n for r in rows if r["kind"] != "ray-documented" for n in r.get("steps_redone", [])]
    details = {
        **machine_details(),
        "minutes": args.minutes, "min_step_seconds": args.min_step_seconds, "steps": steps,
        "interval": args.interval, "rounds": args.rounds, "schedule": schedule, "goodput": goodput,
        "ratio_of": f"{plan.legs[0]} / {plan.legs[1]}", "pair_ratios": [round(p, 4) for p in pairs],
        "spotray_max_steps_redone": max(redone, default=None),
        "spotray_redoes_at_most_one_interval": bool(redone) and max(redone) <= args.interval,
        "exactly_once": "not measured: the ray-documented leg logs no sample ids",
        "legs_run": len(rows), "legs_planned": legs_planned,
        "legs": rows,
    }  # fmt: skip
    command = "python -m bench.head_to_head.real_pods " + " ".join(sys.argv[1:])
    if not pairs:
        print("no round where both legs reached the target: no ratio; legs in the result's details", file=sys.stderr)
    ratio = statistics.median(pairs) if pairs else 0.0
    path = write_result(args.name, ratio, plan.goal, plan.baseline, command.strip(), details)
    print(f"{args.name}: {ratio:.3f} (goal {plan.goal}); goodput {goodput}; -> {path}")
    return 0 if pairs else 1


if __name__ == "__main__":
    raise SystemExit(main())
