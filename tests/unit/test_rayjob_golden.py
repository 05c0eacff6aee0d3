"""Golden tests: TrainingRun (+ controller settings) -> the RayJob the controller creates.

Each tests/data/controller/<case>.input.yaml holds the controller's environment, the attempt and the
TrainingRun; <case>.rayjob.yaml is the expected RayJob. After an intended change to the builder,
regenerate with `SPOTRAY_UPDATE_GOLDEN=1 pytest tests/unit/test_rayjob_golden.py` and review the diff.
"""

import json
import os
from pathlib import Path

import pytest
import yaml

from spotray.contract.spec import RUN_ENV_VAR, RunContext, parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob
from spotray.train.launch.driver_notice import EXIT_MARGIN_S
from tests.pod_security import restricted_violations

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[1] / "data" / "controller"
CASES = sorted(p.name.removesuffix(".input.yaml") for p in DATA.glob("*.input.yaml"))


def build(case: str) -> dict:
    document = yaml.safe_load((DATA / f"{case}.input.yaml").read_text())
    run = parse_training_run(document["trainingRun"])
    config = ControllerConfig.from_env(document["controllerEnv"])
    return build_rayjob(run, document["attempt"], "uid-of-the-run", config)


@pytest.mark.parametrize("case", CASES)
def test_rayjob_matches_the_golden_file(case: str) -> None:
    built = build(case)
    expected_path = DATA / f"{case}.rayjob.yaml"
    if os.environ.get("SPOTRAY_UPDATE_GOLDEN"):
        expected_path.write_text(yaml.safe_dump(built, sort_keys=True))
    assert expected_path.exists(), f"{expected_path} missing: run with SPOTRAY_UPDATE_GOLDEN=1 and review it"
    assert built == yaml.safe_load(expected_path.read_text())


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 3


@pytest.mark.parametrize("case", CASES)
def test_the_job_gets_its_run_context_and_no_credentials(case: str) -> None:
    built = build(case)
    runtime_env = yaml.safe_load(built["spec"]["runtimeEnvYAML"])
    context = RunContext.from_env(runtime_env["env_vars"])
    assert context is not None
    assert context.name == built["metadata"]["labels"]["spotray.dev/run"]
    assert str(context.attempt) == built["metadata"]["labels"]["spotray.dev/attempt"]
    assert built["metadata"]["name"] == f"{context.name}-a{context.attempt}"
    text = json.dumps(built)
    assert "AWS_SECRET_ACCESS_KEY" not in text
    assert "AWS_ACCESS_KEY_ID" not in text
    assert RUN_ENV_VAR in runtime_env["env_vars"]


def test_user_runtime_env_is_kept_beside_the_run_context() -> None:
    runtime_env = yaml.safe_load(build("gpu-nfs")["spec"]["runtimeEnvYAML"])
    assert runtime_env["pip"] == ["einops"]
    assert runtime_env["env_vars"]["HF_HOME"] == "/mnt/shared/hf"


def test_workers_drain_their_ray_node_before_sigterm() -> None:
    worker = build("gpu-nfs")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] == 30
    command = worker["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python", "-m", "spotray.train.launch.drain", "--deadline-seconds", "30"]


def test_the_head_drains_the_whole_cluster_before_sigterm_within_the_workers_grace() -> None:
    """A notice on the head's node ends the cluster: its hook drains every node, so the workers take
    their emergency checkpoint (train/launch/drain.py ``--whole-cluster``), in the same grace period."""
    head = build("gpu-nfs")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["terminationGracePeriodSeconds"] == 30
    command = head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python", "-m", "spotray.train.launch.drain", "--deadline-seconds", "30", "--whole-cluster"]


def test_a_stopped_jobs_driver_has_the_time_of_its_emergency_checkpoint_before_ray_kills_it() -> None:
    """Deleting a RayJob (a suspend, a run deleted) makes KubeRay stop its Ray job: Ray's job supervisor
    sends the driver SIGTERM, which drains every node for an emergency checkpoint, and SIGKILLs it
    RAY_JOB_STOP_WAIT_TIME_S later (Ray's default: 3 s). A driver killed takes Ray Train's workers with
    it, mid-checkpoint: a suspended run once resumed from step 0 (real pods, 1 run in 3). The head's
    supervisor must wait longer than the driver's own bound on the checkpoint (driver_notice.py)."""
    head = build("gpu-nfs")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    env = {item["name"]: item.get("value") for item in head["containers"][0].get("env", [])}
    grace = head["terminationGracePeriodSeconds"]
    assert int(env.get("RAY_JOB_STOP_WAIT_TIME_S") or 3) > grace + EXIT_MARGIN_S


def pod_specs(rayjob: dict) -> dict[str, dict]:
    """Every pod spec of the RayJob, by role: submitter, head, and each worker group."""
    spec = rayjob["spec"]
    pods = {}
    if "submitterPodTemplate" in spec:
        pods["submitter"] = spec["submitterPodTemplate"]["spec"]
    if "rayClusterSpec" in spec:
        cluster = spec["rayClusterSpec"]
        pods["head"] = cluster["headGroupSpec"]["template"]["spec"]
        pods |= {group["groupName"]: group["template"]["spec"] for group in cluster["workerGroupSpecs"]}
    return pods


@pytest.mark.parametrize("case", CASES)
def test_every_pod_of_the_rayjob_meets_pod_security_restricted(case: str) -> None:
    for role, pod in pod_specs(build(case)).items():
        assert restricted_violations(pod) == [], f"{case} {role}"


@pytest.mark.parametrize("case", CASES)
def test_no_pod_of_the_rayjob_mounts_a_kubernetes_api_token(case: str) -> None:
    # The job's code needs no Kubernetes credentials; the namespace's default ServiceAccount is not its own.
    for role, pod in pod_specs(build(case)).items():
        assert pod["automountServiceAccountToken"] is False, f"{case} {role}"


def test_k8s_job_mode_gets_a_restricted_submitter_without_the_s3_secret() -> None:
    document = yaml.safe_load((DATA / "defaults.input.yaml").read_text())
    config = ControllerConfig.from_env({**document["controllerEnv"], "SPOTRAY_SUBMISSION_MODE": "K8sJobMode"})
    spec = build_rayjob(parse_training_run(document["trainingRun"]), 1, "uid", config)["spec"]
    (submitter,) = spec["submitterPodTemplate"]["spec"]["containers"]
    # Ours, not KubeRay's `bash -c` line (tests/unit/test_rayjob_no_shell.py).
    assert submitter["command"][:3] == ["python", "-m", "spotray.train.launch.submitter"]
    assert "envFrom" not in submitter
    assert submitter["image"] == spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    http = ControllerConfig.from_env({**document["controllerEnv"], "SPOTRAY_SUBMISSION_MODE": "HTTPMode"})
    assert (
        "submitterPodTemplate" not in build_rayjob(parse_training_run(document["trainingRun"]), 1, "uid", http)["spec"]
    )


def test_a_run_with_spares_spreads_its_worker_pods_over_nodes_and_one_without_does_not() -> None:
    # A spare on the node of the worker it stands in for would go with it when a reclaim takes it.
    spread = pod_specs(build("gpu-nfs"))["workers"]["affinity"]["podAntiAffinity"]
    (preferred,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"spotray.dev/run": "llm", "ray.io/node-type": "worker"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spread  # a smaller pool still starts the run
    for role, pod in pod_specs(build("defaults")).items():
        assert "affinity" not in pod, role


def test_ray_pods_are_probed_for_readiness_from_their_start_and_old_rays_keep_kuberays_probe() -> None:
    # KubeRay's own probe first asks 10 s after the container starts, and every RayJob waits for it.
    specs = pod_specs(build("defaults"))
    head, worker = specs["head"]["containers"][0], specs["workers"]["containers"][0]
    for container, timeout in ((head, 5), (worker, 2)):
        probe = container["readinessProbe"]
        assert probe["httpGet"] == {"path": "/api/healthz", "port": 52365}
        assert probe.get("initialDelaySeconds", 0) == 0
        assert probe["periodSeconds"] == 2
        assert probe["timeoutSeconds"] == timeout
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 50  # out of service no sooner than KubeRay's
    document = yaml.safe_load((DATA / "defaults.input.yaml").read_text())
    run = parse_training_run(document["trainingRun"])
    for env in ({"SPOTRAY_RAY_READINESS_PERIOD_SECONDS": "0"}, {"SPOTRAY_RAY_VERSION": "2.52.1"}):
        config = ControllerConfig.from_env({**document["controllerEnv"], **env})
        for role, pod in pod_specs(build_rayjob(run, 1, "uid", config)).items():
            if role != "submitter":
                assert "readinessProbe" not in pod["containers"][0], (env, role)
