import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.errors import SpotrayError
from spotray.contract.names import MAX_RESERVED_ATTEMPT, rayjob_name
from spotray.contract.spec import (
    MAX_NAME_LENGTH,
    RUN_ENV_VAR,
    CheckpointSpec,
    InvalidSpecError,
    RunContext,
    default_of,
    encode_spec,
    load_training_run,
    parse_cpu,
    parse_spec,
    parse_training_run,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def manifest(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "entrypoint": "python -m spotray.jobs.gpt2",
        "checkpoint": {"uri": "s3://bucket/runs/a"},
    }
    base.update(spec)
    return {"apiVersion": "spotray.dev/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "run-a"}, "spec": base}


def problems_of(document: Any) -> list[str]:
    with pytest.raises(InvalidSpecError) as caught:
        parse_training_run(document)
    return caught.value.problems


def test_minimal_manifest_gets_defaults() -> None:
    run = parse_training_run(manifest())
    assert run.name == "run-a"
    assert run.namespace == "default"
    assert run.spec.workers.replicas == 2
    assert run.spec.workers.spot is True
    assert run.spec.checkpoint.every_steps == 100
    assert run.spec.checkpoint.keep == 3
    assert run.spec.retry.max_preemptions == 50
    assert run.spec.retry.max_failures == 3
    assert run.spec.data.uri is None


@pytest.mark.parametrize("path", sorted(REPO.glob("jobs/*/trainingrun*.yaml")), ids=lambda p: p.parent.name)
def test_shipped_manifests_are_valid(path: Path) -> None:
    run = load_training_run(path)
    assert run.spec.checkpoint.uri.startswith("s3://")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"workers": {"replicas": 0}}, "spec.workers.replicas: must be >= 1, got 0"),
        ({"workers": {"replicas": "two"}}, "spec.workers.replicas: must be an integer, got 'two'"),
        ({"workers": {"replicas": True}}, "spec.workers.replicas: must be an integer"),
        ({"workers": {"gpu": -1}}, "spec.workers.gpu: must be >= 0"),
        ({"workers": {"spareReplicas": -1}}, "spec.workers.spareReplicas: must be >= 0"),
        ({"workers": {"cpu": "two"}}, "spec.workers.cpu: 'two' is not a CPU quantity"),
        ({"workers": {"cpu": "0"}}, "spec.workers.cpu: must be more than 0"),
        ({"workers": {"memory": "4GB"}}, "spec.workers.memory: '4GB' is not a memory quantity"),
        ({"workers": {"spot": "yes"}}, "spec.workers.spot: must be true or false"),
        ({"workers": {"replica": 2}}, "spec.workers.replica: unknown field"),
        ({"workers": [1, 2]}, "spec.workers: must be a mapping"),
        ({"head": {"memory": "lots"}}, "spec.head.memory: 'lots' is not a memory quantity"),
        ({"checkpoint": {"uri": "s3:/bucket/x"}}, "spec.checkpoint.uri:"),
        ({"checkpoint": {"uri": "s3://bucket/x", "keep": 0}}, "spec.checkpoint.keep: must be >= 1, got 0"),
        ({"checkpoint": {"uri": "s3://bucket/x", "everySteps": -5}}, "spec.checkpoint.everySteps: must be >= 1"),
        (
            {"checkpoint": {"uri": "s3://bucket/x", "everySteps": "often"}},
            'spec.checkpoint.everySteps: must be a number of steps or "auto"',
        ),
        (
            {"checkpoint": {"uri": "s3://bucket/x", "minEverySteps": 50, "maxEverySteps": 20}},
            "spec.checkpoint.maxEverySteps: must be >= minEverySteps (50), got 20",
        ),
        ({"checkpoint": {}}, "spec.checkpoint.uri: missing"),
        ({"data": {"uri": "s3://"}}, "spec.data.uri:"),
        ({"retry": {"maxFailures": -1}}, "spec.retry.maxFailures: must be >= 0"),
        ({"retry": {"backoff": 3}}, "spec.retry.backoff: unknown field"),
        ({"suspend": "no"}, "spec.suspend: must be true or false"),
        ({"runtimeEnv": "pip"}, "spec.runtimeEnv: must be a mapping"),
        ({"entrypoint": ""}, "spec.entrypoint: must be a non-empty string"),
        ({"entrypont": "x"}, "spec.entrypont: unknown field"),
    ],
)
def test_each_bad_field_is_named_with_the_fix(spec: dict[str, Any], says: str) -> None:
    found = problems_of(manifest(**spec))
    assert any(says in problem for problem in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = problems_of(manifest(workers={"replicas": 0, "gpu": -2}, retry={"maxFailures": "x"}))
    assert len(found) == 3


def test_missing_entrypoint_and_checkpoint() -> None:
    document = manifest()
    del document["spec"]["entrypoint"], document["spec"]["checkpoint"]
    found = problems_of(document)
    assert any("spec.entrypoint: missing" in problem for problem in found)
    assert any("spec.checkpoint: missing" in problem for problem in found)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"apiVersion": "v1"}, "apiVersion: must be spotray.dev/v1alpha1"),
        ({"kind": "Job"}, "kind: must be TrainingRun"),
        ({"metadata": {"name": "Bad_Name"}}, "metadata.name:"),
        ({"metadata": {"name": "x" * 60}}, f"at most {MAX_NAME_LENGTH} characters"),
        ({"spec": None}, "spec: must be a mapping"),
    ],
)
def test_document_level_problems(change: dict[str, Any], says: str) -> None:
    found = problems_of({**manifest(), **change})
    assert any(says in problem for problem in found), found


# KubeRay v1.6.1's rules, as its source states them (ray-operator/controllers/ray/utils/): a RayJob
# name at most 47 characters (constant.go MaxRayJobNameLength = MaxRayClusterNameLength - 6) and a
# DNS-1035 label (validation.go ValidateRayJobMetadata); its RayCluster <rayjob>-<5 random>
# (util.go GenerateRayClusterName) at most 53 and a DNS-1035 label (ValidateRayClusterMetadata);
# the Services <cluster>-head-svc, -serve-svc, -headless at most 63 (a DNS-1035 label's limit).
KUBERAY_MAX_RAYJOB_NAME, KUBERAY_MAX_RAYCLUSTER_NAME, DNS_LABEL_MAX = 47, 53, 63
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def kuberay_refuses(run_name: str, attempt: int) -> list[str]:
    """What KubeRay would refuse among the names it makes from attempt ``attempt``'s RayJob."""
    job = rayjob_name(run_name, attempt)
    cluster = f"{job}-x7k2q"
    names = {job: KUBERAY_MAX_RAYJOB_NAME, cluster: KUBERAY_MAX_RAYCLUSTER_NAME}
    names |= {f"{cluster}-{suffix}": DNS_LABEL_MAX for suffix in ("head-svc", "serve-svc", "headless")}
    names[f"{job}-head-svc"] = DNS_LABEL_MAX  # the RayJob's own head Service
    return [f"{name} ({len(name)} > {limit})" for name, limit in names.items() if len(name) > limit] + [
        f"{name} is no DNS-1035 label" for name in names if not DNS_1035_LABEL.match(name)
    ]


def test_a_name_whose_rayjob_kuberay_refuses_is_refused_saying_the_limit_and_why() -> None:
    # The run: 46 characters, accepted up to 50, and its RayJob <name>-a1 (49) ValidationFailed.
    name = "llama-3-8b-finetune-spot-us-east-1a-2026-05-07"
    assert len(name) == 46
    assert kuberay_refuses(name, 1)
    found = problems_of({**manifest(), "metadata": {"name": name}})
    assert len(found) == 1
    assert found[0].startswith(f"metadata.name: must be at most {MAX_NAME_LENGTH} characters"), found
    assert "46 characters" in found[0]
    assert f"refuses RayJob names over {KUBERAY_MAX_RAYJOB_NAME}" in found[0]


@pytest.mark.parametrize("name", ["0-numeric-start", "7b-run", "-leading", "trailing-", "run.with.dots", "Upper"])
def test_a_name_that_is_no_dns_1035_label_is_refused_saying_why(name: str) -> None:
    found = problems_of({**manifest(), "metadata": {"name": name}})
    assert len(found) == 1
    assert found[0].startswith("metadata.name: must start with a lowercase letter"), found
    assert "DNS-1035" in found[0]


def test_the_longest_allowed_name_gives_names_kuberay_accepts_up_to_the_reserved_attempt() -> None:
    assert MAX_RESERVED_ATTEMPT >= 999  # a spot run's default budget is 54 attempts; suspensions add more
    longest = "a" + "b" * (MAX_NAME_LENGTH - 1)
    assert parse_training_run({**manifest(), "metadata": {"name": longest}}).name == longest
    for attempt in (1, 9, 10, 99, 100, MAX_RESERVED_ATTEMPT):
        assert kuberay_refuses(longest, attempt) == [], attempt
    # One character more would not fit the reserved attempt: the limit is as long as KubeRay allows.
    assert kuberay_refuses(longest + "c", MAX_RESERVED_ATTEMPT)
    assert problems_of({**manifest(), "metadata": {"name": longest + "c"}})


def test_message_lists_problems_and_the_fix() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_training_run(manifest(workers={"replicas": 0}), where="run.yaml")
    text = str(caught.value)
    assert text.startswith("run.yaml is not valid:")
    assert "kubectl explain trainingrun.spec" in text


def test_cpu_quantities() -> None:
    assert parse_cpu("2") == 2
    assert parse_cpu("500m") == 0.5
    assert parse_cpu("1.5") == 1.5
    with pytest.raises(ValueError, match="not a CPU quantity"):
        parse_cpu("2 cores")


def test_workers_per_gpu() -> None:
    run = parse_training_run(manifest(workers={"replicas": 2, "gpu": 4, "cpu": "8"}))
    assert run.spec.workers.num_workers == 8
    assert run.spec.workers.cpu_per_worker == 2


def test_run_context_round_trips_through_the_environment() -> None:
    run = parse_training_run(manifest(workers={"replicas": 3, "cpu": "500m"}, runtimeEnv={"env_vars": {"A": "1"}}))
    context = RunContext(name=run.name, run_id="3f0c-uid", attempt=4, spec=run.spec)
    assert RunContext.from_env(context.to_env()) == context
    assert RunContext.from_env({}) is None


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(SpotrayError, match="does not exist"):
        load_training_run(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(SpotrayError, match="not valid YAML"):
        load_training_run(bad)
    valid = tmp_path / "ok.yaml"
    valid.write_text(yaml.safe_dump(manifest()))
    assert load_training_run(valid).name == "run-a"


def test_every_steps_auto_with_its_bounds() -> None:
    spec = parse_spec(
        {
            "entrypoint": "python train.py",
            "checkpoint": {"uri": "s3://bucket/x", "everySteps": "auto", "minEverySteps": 5, "maxEverySteps": 50},
        }
    )
    assert spec.checkpoint.auto_interval
    assert spec.checkpoint.fixed_every_steps is None
    assert (spec.checkpoint.min_every_steps, spec.checkpoint.max_every_steps) == (5, 50)
    fixed = parse_spec({"entrypoint": "python train.py", "checkpoint": {"uri": "s3://bucket/x", "everySteps": 40}})
    assert (fixed.checkpoint.auto_interval, fixed.checkpoint.fixed_every_steps) == (False, 40)


FULL_SPEC: dict[str, Any] = {
    "entrypoint": "python -m spotray.jobs.gpt2 --max-steps 10",
    "checkpoint": {
        "uri": "s3://bucket/runs/a",
        "everySteps": "auto",
        "minEverySteps": 4,
        "maxEverySteps": 40,
        "keep": 2,
        "nodeCopies": 2,
        "secretRef": "creds",
    },
    "workers": {
        "replicas": 4,
        "minReplicas": 2,
        "spareReplicas": 1,
        "cpu": "500m",
        "memory": "2Gi",
        "gpu": 1,
        "spot": False,
    },
    "head": {"cpu": "2", "memory": "8Gi"},
    "data": {"uri": "s3://bucket/data"},
    "retry": {"maxPreemptions": 5, "maxFailures": 1, "backoffSeconds": 0},
    "image": "example/spotray:1",
    "runtimeEnv": {"env_vars": {"A": "1"}},
    "secretEnv": {"HF_TOKEN": "hf-token/token"},
    "suspend": True,
}


@pytest.mark.parametrize("spec", [FULL_SPEC, manifest()["spec"]], ids=["every-field", "minimal"])
def test_the_codec_writes_the_manifest_form_and_reads_it_back(spec: dict[str, Any]) -> None:
    parsed = parse_spec(spec)
    encoded = encode_spec(parsed)
    assert parse_spec(encoded) == parsed
    if spec is FULL_SPEC:
        assert encoded == FULL_SPEC  # every field set: the same mapping, key for key


def test_a_job_checks_the_spec_it_is_given_as_the_api_server_would() -> None:
    run = parse_training_run(manifest())
    env = RunContext(name=run.name, run_id="uid-1", attempt=1, spec=run.spec).to_env()
    sent = json.loads(env[RUN_ENV_VAR])
    sent["spec"]["checkpoint"]["keep"] = 0
    with pytest.raises(InvalidSpecError) as caught:
        RunContext.from_env({RUN_ENV_VAR: json.dumps(sent)})
    assert caught.value.problems == ["spec.checkpoint.keep: must be >= 1, got 0"]
    assert str(caught.value).startswith(f"{RUN_ENV_VAR} is not valid:")


def test_hand_start_flags_take_default_and_help_from_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    from spotray.jobs.common import RUN_FLAGS, add_run_flags, run_context  # noqa: PLC0415 - the job side

    monkeypatch.delenv(RUN_ENV_VAR, raising=False)
    parser = argparse.ArgumentParser()
    add_run_flags(parser, run_name="job", data_help="data")
    args = parser.parse_args(["--checkpoint-uri", "s3://bucket/x"])
    for flag in RUN_FLAGS[1:]:  # all but --checkpoint-uri, given above
        assert getattr(args, flag.dest) == default_of(flag.section, flag.field), flag.flag
    checkpoint = run_context(args).spec.checkpoint
    assert (checkpoint.keep, checkpoint.every_steps) == (default_of(CheckpointSpec, "keep"), 100)
    with pytest.raises(InvalidSpecError) as caught:
        run_context(parser.parse_args(["--checkpoint-uri", "s3:/bucket", "--keep", "0", "--cpu-per-worker", "x"]))
    named = sorted(problem.split(":")[0] for problem in caught.value.problems)
    assert named == ["--checkpoint-uri", "--cpu-per-worker", "--keep"]


@pytest.mark.parametrize(
    ("start_from", "says"),
    [
        ("s3://bucket/runs/b", "must end with a checkpoint's directory, checkpoint-<step>"),
        ("s3://bucket/runs/a/checkpoint-10", "is under this run's own checkpoint.uri"),
        ("s3://x/runs/b/checkpoint-10", "not a valid S3 bucket name"),
    ],
)
def test_start_from_names_another_runs_checkpoint_directory(start_from: str, says: str) -> None:
    found = problems_of(manifest(checkpoint={"uri": "s3://bucket/runs/a", "startFrom": start_from}))
    assert any("spec.checkpoint.startFrom: " in problem and says in problem for problem in found), found


def test_start_from_another_runs_checkpoint_is_read_and_travels_to_the_job() -> None:
    for start_from in ("s3://bucket/runs/ab/checkpoint-10", "s3://bucket/runs/b/checkpoint-10/", "/mnt/x/checkpoint-3"):
        spec = parse_training_run(manifest(checkpoint={"uri": "s3://bucket/runs/a", "startFrom": start_from})).spec
        assert spec.checkpoint.start_from == start_from
        assert parse_spec(encode_spec(spec)) == spec
