"""spec.secretEnv: environment variables of the job from Secrets, by reference only.

The parser and the CRD refuse the same entries (tests/e2e/test_crd_validation.py asks the real API
server); the RayJob gives each one to the head and the workers as a ``secretKeyRef``, which the
kubelet resolves, and nowhere else; local mode takes the values from its own environment and
refuses, before anything starts, a run whose variables it lacks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.cli import main as cli
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import (
    RUN_ENV_VAR,
    InvalidSpecError,
    RunContext,
    RunSpec,
    TrainingRun,
    declaration,
    parse_training_run,
    reserved_env_name,
)
from spotray.controller.config import ControllerConfig
from spotray.controller.crd import spec_schema
from spotray.controller.rayjob import build_rayjob, secret_env_refusal
from spotray.local.local_ray import LocalRayCluster
from spotray.local.local_run import Faults, LocalRun, secret_env_from
from spotray.local.progress import ProgressView
from spotray.train.storage.local_s3 import LocalS3Server

pytestmark = pytest.mark.unit

SECRET_ENV = {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "tracker.keys/wandb.key"}
# What a value would look like: nothing built from the spec may hold it.
VALUE = "hf_sEcReT-vAlUe-1234"


def manifest(secret_env: Any = None, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "entrypoint": "python -m spotray.jobs.gpt2",
        "checkpoint": {"uri": "s3://bucket/runs/a"},
        "workers": {"gpu": 0},
        **spec,
    }
    if secret_env is not None:
        base["secretEnv"] = secret_env
    return {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "run-a"}, "spec": base}


def problems_of(secret_env: Any) -> list[str]:
    with pytest.raises(InvalidSpecError) as caught:
        parse_training_run(manifest(secret_env))
    return caught.value.problems


# ------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    "secret_env",
    [
        SECRET_ENV,
        {"_private": "a/b", "x1": "a.b.c/.dotfile", "Mixed_Case": "s-1/a..b", "T": "s/key-with_all.chars"},
        {"LONG": f"{'a' * 253}/{'k' * 253}", "N" * 128: "s/k"},
        {f"V{i}": "s/k" for i in range(declaration(RunSpec, "secret_env").max_items or 0)},
        {},
    ],
    ids=["two", "edge-characters", "longest", "most", "empty"],
)
def test_a_valid_secret_env_is_read_as_written(secret_env: dict[str, str]) -> None:
    assert parse_training_run(manifest(secret_env)).spec.secret_env == secret_env


def test_absent_is_empty_and_left_out_of_the_jobs_spec() -> None:
    """A run without it sends a spec that a job with an older spotray still reads."""
    run = parse_training_run(manifest())
    assert run.spec.secret_env == {}
    sent = json.loads(RunContext(name=run.name, run_id="uid", attempt=1, spec=run.spec).to_env()[RUN_ENV_VAR])
    assert "secretEnv" not in sent["spec"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("1TOKEN", "must be a C identifier"),
        ("HF-TOKEN", "must be a C identifier"),
        ("HF TOKEN", "must be a C identifier"),
        ("HF.TOKEN", "must be a C identifier"),
        ("", "must be a C identifier"),
        ("N" * 129, "at most 128 characters"),
        ("SPOTRAY_RUN", "must not start with SPOTRAY_"),
        ("SPOTRAY_TOKEN", "must not start with SPOTRAY_"),
        ("RAY_ADDRESS", "must not start with SPOTRAY_, RAY_"),
        ("RAY_AUTH_TOKEN", "spotray, KubeRay or Ray set those"),
        ("AWS_SECRET_ACCESS_KEY", "(AWS_*: the checkpoint Secret)"),
        ("KUBERAY_GEN_RAY_START_CMD", "KUBERAY_"),
        ("FQ_RAY_IP", "nor be FQ_RAY_IP"),
        ("REDIS_PASSWORD", "REDIS_PASSWORD"),
        ("S3_ENDPOINT_URL", "S3_ENDPOINT_URL"),
        ("MASTER_ADDR", "MASTER_ADDR"),
        ("CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
        ("PATH", "PATH"),
    ],
)
def test_a_bad_or_reserved_variable_name_is_named_with_the_rule(name: str, says: str) -> None:
    (problem,) = problems_of({name: "hf-token/token"})
    assert problem.startswith(f"spec.secretEnv.{name}: the variable's name must "), problem
    assert says in problem
    if "C identifier" not in says and "128" not in says:
        assert problem.endswith("give the variable another name")


@pytest.mark.parametrize(
    "ref",
    [
        "hf-token",  # no key
        "hf-token/",
        "/token",
        "Hf-Token/token",  # a Secret's name is lowercase
        "hf_token/token",
        "-hf/token",
        "hf-/token",
        "hf..token/token",
        "a/b/c",
        "hf-token/to ken",
        "hf-token/tok$en",
        "hf-token/.",  # Kubernetes refuses these keys
        "hf-token/..",
        "hf-token/..token",
        f"{'a' * 254}/token",
        f"hf-token/{'k' * 254}",
        "",
        5,
        ["hf-token", "token"],
        {"name": "hf-token", "key": "token"},
    ],
)
def test_a_value_that_is_not_secret_slash_key_is_named_with_the_form(ref: Any) -> None:
    (problem,) = problems_of({"HF_TOKEN": ref})
    assert problem.startswith("spec.secretEnv.HF_TOKEN: the value must be SECRET/KEY"), problem
    assert "e.g. hf-token/token" in problem
    assert problem.endswith(f"got {ref!r}")


def test_too_many_variables_are_refused_with_what_to_do() -> None:
    most = declaration(RunSpec, "secret_env").max_items
    assert most == 32
    (problem,) = problems_of({f"V{i}": "s/k" for i in range(most + 1)})
    assert problem.startswith(f"spec.secretEnv: at most {most} variables, got {most + 1}"), problem


@pytest.mark.parametrize("value", ["HF_TOKEN=hf-token/token", ["HF_TOKEN"], 5])
def test_a_secret_env_that_is_no_mapping_is_refused(value: Any) -> None:
    (problem,) = problems_of(value)
    assert problem.startswith("spec.secretEnv: must be a mapping"), problem


def test_every_bad_entry_is_reported_at_once_both_halves_of_one_entry_too() -> None:
    found = problems_of({"RAY_TOKEN": "x", "1X": "hf-token/token", "OK": "hf-token/token", "BAD": "a/."})
    assert sorted(problem.split(":")[0] for problem in found) == [
        "spec.secretEnv.1X",
        "spec.secretEnv.BAD",
        "spec.secretEnv.RAY_TOKEN",
    ]
    (both,) = [problem for problem in found if problem.startswith("spec.secretEnv.RAY_TOKEN")]
    assert "must not start with" in both
    assert "the value must be SECRET/KEY" in both


def test_the_crd_declares_the_parsers_limits_and_keeps_no_unknown_entries() -> None:
    schema = spec_schema()["properties"]["secretEnv"]
    assert schema["type"] == "object"
    assert "x-kubernetes-preserve-unknown-fields" not in schema
    assert schema["maxProperties"] == declaration(RunSpec, "secret_env").max_items
    assert schema["additionalProperties"]["type"] == "string"
    messages = " ".join(rule["message"] for rule in schema["x-kubernetes-validations"])
    assert "C identifier" in messages
    assert "SPOTRAY_, RAY_, AWS_, KUBERAY_" in messages
    assert "SECRET/KEY" in messages


# ------------------------------------------------------------------------------ the RayJob


def rayjob(secret_env: dict[str, str], **env: str) -> dict[str, Any]:
    run = parse_training_run(manifest(secret_env))
    return build_rayjob(run, 1, "uid-of-the-run", ControllerConfig.from_env(env))


def containers(built: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = built["spec"]["rayClusterSpec"]
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    pods |= {group["groupName"]: group["template"]["spec"] for group in cluster["workerGroupSpecs"]}
    if "submitterPodTemplate" in built["spec"]:
        pods["submitter"] = built["spec"]["submitterPodTemplate"]["spec"]
    return {role: container for role, pod in pods.items() for container in pod["containers"]}


def test_the_head_and_every_worker_get_each_variable_as_a_secret_key_ref() -> None:
    built = rayjob(SECRET_ENV, SPOTRAY_S3_ENDPOINT="http://minio:9000", SPOTRAY_S3_SECRET="s3-creds")
    expected = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "tracker.keys", "key": "wandb.key"}}},
    ]
    ray_containers = {role: c for role, c in containers(built).items() if role != "submitter"}
    assert set(ray_containers) == {"head", "workers"}
    for role, container in ray_containers.items():
        from_secrets = [item for item in container["env"] if "valueFrom" in item]
        assert from_secrets == expected, role
        assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}], "the checkpoint Secret stays"


def test_no_variable_reaches_the_runtime_env_or_the_submitter() -> None:
    """Ray shows the runtime env on its dashboard and the submitter's argv is in the RayJob: only the
    reference (no value exists here) rides along, inside SPOTRAY_RUN's copy of the spec."""
    built = rayjob(SECRET_ENV)
    runtime_env = yaml.safe_load(built["spec"]["runtimeEnvYAML"])
    assert set(runtime_env["env_vars"]) == {RUN_ENV_VAR}
    context = RunContext.from_env(runtime_env["env_vars"])
    assert context is not None
    assert context.spec.secret_env == SECRET_ENV
    submitter = containers(built)["submitter"]
    assert "env" not in submitter
    assert "envFrom" not in submitter
    assert "secretKeyRef" not in json.dumps(submitter)


def test_a_run_without_secret_env_gets_no_env_items_from_it() -> None:
    for role, container in containers(rayjob({})).items():
        assert not [item for item in container.get("env", []) if "valueFrom" in item], role


def test_every_variable_the_rayjob_sets_itself_is_one_secret_env_may_not_name() -> None:
    """A Secret's value under one of these names would override the builder's, or be overridden."""
    built = rayjob(SECRET_ENV, SPOTRAY_S3_ENDPOINT="http://minio:9000")
    own = {
        item["name"]
        for container in containers(built).values()
        for item in container.get("env", [])
        if "valueFrom" not in item
    }
    own |= set(yaml.safe_load(built["spec"]["runtimeEnvYAML"])["env_vars"])
    assert own >= {"AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", RUN_ENV_VAR}
    assert [name for name in own if not reserved_env_name(name)] == []


def test_the_long_lived_ray_cluster_refuses_a_run_with_secret_env_as_bad_input() -> None:
    """Its pods started without the run's Secrets: the job would run without its variables."""
    run = parse_training_run(manifest(SECRET_ENV))
    shared = ControllerConfig(ray_cluster_selector={"ray.io/cluster": "spotray-ray"})
    refusal = secret_env_refusal(run, shared)
    assert refusal is not None
    assert refusal.content_is_cause
    assert "HF_TOKEN, WANDB_API_KEY" in refusal.message
    assert "rayCluster.enabled" in refusal.message
    assert secret_env_refusal(run, ControllerConfig()) is None
    assert secret_env_refusal(parse_training_run(manifest()), shared) is None


# ------------------------------------------------------------------------------ local mode


def local_run(secret_env: dict[str, str]) -> TrainingRun:
    return parse_training_run(manifest(secret_env))


def test_local_mode_takes_each_variable_from_its_own_environment() -> None:
    environ = {"HF_TOKEN": VALUE, "WANDB_API_KEY": "w", "OTHER": "x"}
    assert secret_env_from(local_run(SECRET_ENV), environ) == {"HF_TOKEN": VALUE, "WANDB_API_KEY": "w"}
    assert secret_env_from(local_run({}), environ) == {}


def test_local_mode_names_every_missing_variable_and_the_export_that_fixes_it() -> None:
    with pytest.raises(SpotrayError) as caught:
        secret_env_from(local_run(SECRET_ENV), {"OTHER": VALUE})
    error = caught.value
    assert "HF_TOKEN (key token of Secret hf-token on a cluster)" in error.problem
    assert "WANDB_API_KEY (key wandb.key of Secret tracker.keys on a cluster)" in error.problem
    assert "export HF_TOKEN=...; export WANDB_API_KEY=..." in error.fix
    assert VALUE not in str(error)


def test_a_local_run_missing_a_variable_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", VALUE)
    workdir = tmp_path / "work"
    with pytest.raises(SpotrayError, match="export HF_TOKEN=") as caught:
        LocalRun(local_run(SECRET_ENV), workdir, Faults(), progress=ProgressView())
    assert VALUE not in str(caught.value)
    assert not workdir.exists(), "nothing started: no work directory, no run state"


def test_spotray_run_local_without_a_variable_exits_as_bad_input_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "stop_like_ctrl_c", lambda: None)  # not this test process's signals
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", VALUE)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest(SECRET_ENV)))
    assert cli.main(["run", str(path), "--local", "--workdir", str(tmp_path / "work")]) == 2
    said = capsys.readouterr().err
    assert "error: spec.secretEnv names HF_TOKEN (key token of Secret hf-token on a cluster)" in said
    assert "fix: `export HF_TOKEN=...`" in said
    assert VALUE not in said
    assert not (tmp_path / "work").exists()


def test_the_driver_gets_the_values_and_its_run_context_only_the_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("WANDB_API_KEY", VALUE)
    run = local_run(SECRET_ENV)
    local = LocalRun(run, tmp_path, Faults(), progress=ProgressView())
    context = RunContext(name=run.name, run_id="local-1", attempt=1, spec=run.spec)
    env = local.driver_env(context, "127.0.0.2:6379")
    assert (env["HF_TOKEN"], env["WANDB_API_KEY"]) == (VALUE, VALUE)
    assert VALUE not in env[RUN_ENV_VAR]
    assert json.loads(env[RUN_ENV_VAR])["spec"]["secretEnv"] == SECRET_ENV
    assert local.secret_env == {"HF_TOKEN": VALUE, "WANDB_API_KEY": VALUE}  # the Ray cluster's env gets these


def test_every_variable_local_mode_sets_itself_is_one_secret_env_may_not_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", VALUE)
    run = local_run({"HF_TOKEN": "hf-token/token"})
    local = LocalRun(run, tmp_path, Faults(), progress=ProgressView())
    local.s3_env = LocalS3Server(tmp_path / "s3").env()
    context = RunContext(name=run.name, run_id="local-1", attempt=1, spec=run.spec)
    driver = local.driver_env(context, "127.0.0.2:6379")
    ray = LocalRayCluster(num_cpus=1, temp_dir=tmp_path / "ray").ray_env()
    own = {name for env in (driver, ray) for name, value in env.items() if os.environ.get(name) != value}
    own |= set(local.s3_env)
    assert own >= {RUN_ENV_VAR, "RAY_ADDRESS", "PATH", "GLOO_SOCKET_IFNAME", "AWS_ENDPOINT_URL", "S3_ENDPOINT_URL"}
    assert [name for name in own if not reserved_env_name(name)] == []
