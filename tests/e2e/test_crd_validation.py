"""The generated TrainingRun CRD on the real kube-apiserver, checked against spotray/contract/spec.py.

Each malformed TrainingRun below has exactly one fault (the API server skips the CEL rules when a
plain schema check already failed, so one fault per object keeps every rule exercised). For each,
the API server must refuse it with an error on the faulty field, and ``parse_training_run`` must
refuse it naming the same field path: the cluster and ``spotray run --local`` agree on what a valid
TrainingRun is.

Unknown fields: by default the API server prunes them (with a warning) instead of refusing.
``fieldValidation=Strict`` (what `kubectl apply --validate=strict`, kubectl's default, asks for)
turns that into a refusal, so the malformed cases are sent with it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spotray.contract.names import CRD_NAME, PLURAL, VERSION
from spotray.contract.names import GROUP as API_GROUP
from spotray.contract.spec import MAX_NAME_LENGTH, InvalidSpecError, parse_training_run
from spotray.controller.crd import CRD_PATH, spec_schema
from spotray.controller.kube import Cluster
from spotray.decisions.attempt_end import AttemptEnd, end_attempt, start_attempt
from spotray.decisions.conditions import conditions
from spotray.decisions.run_state import RunState
from spotray.decisions.vocabulary import MAX_MESSAGE_CHARS
from tests.e2e.conftest import tb

pytestmark = pytest.mark.e2e

_DELETE = object()


def base_manifest(name: str = "fuzz") -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bucket/runs/fuzz"}},
    }


def with_field(path: str, value: Any, name: str = "fuzz") -> dict[str, Any]:
    """The base manifest with one field (a dotted path from the root) set, or removed for _DELETE."""
    document = base_manifest(name)
    *parents, last = path.split(".")
    target = document
    for part in parents:
        target = target.setdefault(part, {})
    if value is _DELETE:
        target.pop(last, None)
    else:
        target[last] = value
    return document


@dataclass(frozen=True)
class Case:
    id: str
    document: dict[str, Any]
    field: str  # the path both the API server and the parser must name
    parser_field: str | None = None  # where the parser is more precise: a map's entry, not the map
    server_says: str = ""  # in the API server's message: the rule that refused it, not another


def secret_env_cases() -> list[Case]:
    """spec.secretEnv: the API server names the map (its rules on names and values are CEL over the
    whole map: a structural schema declares nothing on a map's keys), the parser the entry."""
    cases: list[Case] = []

    def add(secret_env: dict[str, Any], parser_field: str, says: str, field: str = "spec.secretEnv") -> None:
        label = json.dumps(secret_env)[:60]
        document = with_field("spec.secretEnv", secret_env)
        cases.append(Case(f"secretEnv:{label}", document, field, parser_field, says))

    for name in ["1X", "HF-TOKEN", "HF.TOKEN", "N" * 129, "SPOTRAY_RUN", "RAY_ADDRESS", "RAY_AUTH_TOKEN",
                 "AWS_SECRET_ACCESS_KEY", "KUBERAY_GEN_RAY_START_CMD", "FQ_RAY_IP", "REDIS_PASSWORD",
                 "S3_ENDPOINT_URL", "MASTER_ADDR", "PATH"]:  # fmt: skip
        add({name: "hf-token/token"}, f"spec.secretEnv.{name}", "each variable's name must")
    for ref in ["hf-token", "hf-token/", "/token", "Hf-Token/token", "hf_token/token", "-hf/token", "a..b/token",
                "a/b/c", "hf-token/to ken", "hf-token/.", "hf-token/..", "hf-token/..x", "", "a" * 254 + "/k",
                "hf-token/" + "k" * 254]:  # fmt: skip
        add({"HF_TOKEN": ref}, "spec.secretEnv.HF_TOKEN", "each value must be SECRET/KEY")
    for value in [5, True, ["hf-token", "token"]]:
        add({"HF_TOKEN": value}, "spec.secretEnv.HF_TOKEN", "must be of type string", "spec.secretEnv.HF_TOKEN")
    add({f"V{i}": "s/k" for i in range(33)}, "spec.secretEnv", "must have at most 32 items")
    return cases


def leaf_schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    """(path under spec, schema) of every spec field, sections included."""

    def walk(schema: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for name, child in schema.get("properties", {}).items():
            yield f"{prefix}{name}", child
            if "properties" in child:
                yield from walk(child, f"{prefix}{name}.")

    yield from walk(spec_schema(), "")


def wrong_type_values(schema: dict[str, Any]) -> list[Any]:
    """Values of the wrong JSON type for a schema. Numbers are left out for strings: the parser,
    like YAML users, takes `cpu: 2` as "2"; null is left out everywhere: the API server drops it."""
    if schema.get("x-kubernetes-int-or-string"):
        return [True, ["1"], {"value": "1"}]
    return {
        "integer": ["two", 1.5, True, [1]],
        # 123: YAML's `image: 123` (only quantities, which are int-or-string, may be a number; issue 72)
        "string": [True, 123, ["x"], {"x": "y"}],
        "boolean": ["yes", 1, "true"],
        "object": ["x", 5, [1]],
        "array": ["x", 5, {"x": "y"}],
    }[schema["type"]]


def malformed_cases() -> list[Case]:
    cases: list[Case] = []

    def add(kind: str, path: str, value: Any, field: str | None = None) -> None:
        label = "missing" if value is _DELETE else json.dumps(value)[:40]
        cases.append(Case(f"{kind}:{path}={label}", with_field(path, value), field or path))

    for path, schema in leaf_schemas():
        for value in wrong_type_values(schema):
            add("type", f"spec.{path}", value)

    add("missing", "spec", _DELETE)
    add("missing", "spec.entrypoint", _DELETE)
    add("missing", "spec.checkpoint", _DELETE)
    add("missing", "spec.checkpoint.uri", _DELETE)

    for section in ("workers", "head"):
        for cpu in ["two", "1.5.5", "-1", "0", "0m", "0.0", "1e3", "500M", "", 0, -2]:
            add("quantity", f"spec.{section}.cpu", cpu)
        for memory in ["4GB?", "4GB", "-1Gi", "lots", "4 Gi", "4gi", "Gi", "", -1]:
            add("quantity", f"spec.{section}.memory", memory)

    for path, value in [
        ("workers.replicas", 0),
        ("workers.replicas", -1),
        ("workers.gpu", -1),
        ("checkpoint.everySteps", 0),
        ("checkpoint.keep", 0),
        ("checkpoint.keep", -3),
        ("retry.maxPreemptions", -1),
        ("retry.maxFailures", -1),
        ("retry.backoffSeconds", -5),
    ]:
        add("count", f"spec.{path}", value)

    for uri in [
        "s3://",
        "http://x",
        "https://bucket.s3.amazonaws.com/x",
        "s3://Bad_Bucket/x",
        "s3:///prefix",
        "s3://ab/x",
        "s3://-bucket/x",
        "s3://bucket-/x",
        "s3://user@bucket/x",
        "s3://bucket:9000/x",
        "s3://bucket/x?versionId=1",
        "s3://bucket/x#part",
        "gs://bucket/x",
        "relative/path",
        "file://relative",
        "file://host/x",
        "file:relative",
        "",
        "   ",
    ]:
        add("uri", "spec.checkpoint.uri", uri)
        add("uri", "spec.data.uri", uri)

    add("auto", "spec.checkpoint.everySteps", "often")  # a string, but not "auto"
    add("bounds", "spec.checkpoint.maxEverySteps", 5)  # below minEverySteps' default, 10

    for path in ("entrypoint", "image", "checkpoint.secretRef"):
        add("blank", f"spec.{path}", "")
        add("blank", f"spec.{path}", "  ")
    # A Secret's name is a DNS subdomain (issue 72: `secretRef: "Bad Name"` passed the parser).
    for path in ("spec.checkpoint.secretRef", "spec.checkpoint.keySecret"):
        add("name", path, "Bad Name")
        add("name", path, "under_score")

    for path in (
        "spec.foo",
        "spec.workers.gpus",
        "spec.head.gpu",
        "spec.checkpoint.every_steps",
        "spec.data.url",
        "spec.retry.maxRetries",
    ):
        add("unknown", path, 1)

    # KubeRay v1.6.1 refuses a RayJob <name>-a<attempt> over 47 characters or not a DNS-1035 label
    # (a lowercase letter first): the issue's 46-character name, and names starting with a digit.
    issue = "llama-3-8b-finetune-spot-us-east-1a-2026-05-07"
    too_long = ["a" * (MAX_NAME_LENGTH + 1), issue, "b" * 63]
    for name in [*too_long, "run.with.dots", "Upper", "-leading", "trailing-", "0-numeric-start", "7b"]:
        cases.append(Case(f"name:{name}", base_manifest(name), "metadata.name"))
    return cases + secret_env_cases() + placement_cases()


def placement_cases() -> list[Case]:
    """spec.head/spec.workers placement (spotray/contract/kube_values.py): a map's keys are CEL over
    the map, so the API server names the map and the parser the entry; a toleration's fields by schema."""
    cases: list[Case] = []
    for section in ("workers", "head"):
        at = f"spec.{section}"
        maps: list[tuple[str, dict[str, Any], str, str]] = [
            ("labels", {"spotray.dev/run": "x"}, "spotray.dev/run", "no key may start with spotray.dev/"),
            ("labels", {"ray.io/node-type": "x"}, "ray.io/node-type", "no key may start with"),
            ("labels", {"team": "a b"}, "team", "should match"),
            ("labels", {"bad key": "a"}, "bad key", "each key must be a qualified name"),
            ("nodeSelector", {"-x": "a"}, "-x", "each key must be a qualified name"),
            ("nodeSelector", {"gpu": "x" * 64}, "gpu", "may not be more than 63"),
            ("annotations", {"a/b/c": "x"}, "a/b/c", "each key must be a qualified name"),
        ]
        for name, value, key, says in maps:
            field = f"{at}.{name}" if "key" in says or "start with" in says else f"{at}.{name}.{key}"
            cases.append(Case(f"placement:{at}.{name}={json.dumps(value)[:30]}", with_field(f"{at}.{name}", value),
                              field, f"{at}.{name}.{key}", says))  # fmt: skip
        for toleration, where in [
            ({"key": "k", "operator": "Bad"}, "operator"),
            ({"key": "k", "operator": "Exists", "effect": "Never"}, "effect"),
            ({"key": "k", "seconds": 5}, "seconds"),
        ]:
            path = f"{at}.tolerations[0].{where}"
            cases.append(Case(f"placement:{path}", with_field(f"{at}.tolerations", [toleration]), path))
        for name, value in [("serviceAccountName", "Bad_Name"), ("priorityClassName", "-x"), ("shmSize", "lots")]:
            cases.append(Case(f"placement:{at}.{name}={value}", with_field(f"{at}.{name}", value), f"{at}.{name}"))
    cases.append(
        Case("placement:gpuResource", with_field("spec.workers.gpuResource", "a gpu"), "spec.workers.gpuResource")
    )
    cases.append(
        Case("retry:maxWaitSeconds=0", with_field("spec.retry.maxWaitSeconds", 0), "spec.retry.maxWaitSeconds")
    )
    return cases


MALFORMED = malformed_cases()

# Edge cases that are valid: the CRD must not be stricter than the parser here.
ACCEPTED: list[tuple[str, Any]] = [
    ("spec.workers.cpu", "500m"),
    ("spec.workers.cpu", "0.5"),
    ("spec.workers.cpu", 2),
    ("spec.workers.cpu", "0.001"),
    ("spec.head.memory", "512Mi"),
    ("spec.head.memory", 1073741824),
    ("spec.head.memory", "1.5G"),
    ("spec.workers.gpu", 8),
    ("spec.workers.replicas", 1),
    ("spec.retry.maxFailures", 0),
    ("spec.retry.maxPreemptions", 0),
    ("spec.checkpoint.uri", "s3://bucket"),
    ("spec.checkpoint.uri", "s3://bucket/"),
    ("spec.checkpoint.uri", "s3://my.bucket-1/runs/a/b"),
    ("spec.checkpoint.uri", "s3a://bucket/x"),
    ("spec.checkpoint.uri", "S3://bucket/x"),
    ("spec.checkpoint.uri", "/mnt/shared/runs/a"),
    ("spec.checkpoint.uri", "file:///mnt/shared/runs/a"),
    ("spec.checkpoint.uri", "file://localhost/mnt/x"),
    ("spec.checkpoint.uri", "file:/mnt/x"),
    ("spec.data.uri", "s3://bucket/datasets/x"),
    ("spec.image", "rayproject/ray:2.60.0"),
    ("spec.checkpoint.secretRef", "s3-credentials"),
    ("spec.runtimeEnv", {"env_vars": {"A": "1"}, "pip": ["x"], "nested": {"any": [1, {"thing": True}]}}),
    ("spec.secretEnv", {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "tracker.keys/wandb.key"}),
    ("spec.secretEnv", {"_x": "a/.dotfile", "Mixed_Case9": "s-1/a..b", "T": "s/key-with_all.chars"}),
    ("spec.secretEnv", {"LONG": "a" * 253 + "/" + "k" * 253, "N" * 128: "s/k"}),
    ("spec.secretEnv", {f"V{i}": "s/k" for i in range(32)}),
    ("spec.suspend", True),
    ("spec.retry.maxWaitSeconds", 3600),
    ("spec.workers.nodeSelector", {"karpenter.sh/capacity-type": "spot", "nvidia.com/gpu.product": "H100-80GB"}),
    (
        "spec.workers.tolerations",
        [
            {
                "key": "kubernetes.azure.com/scalesetpriority",
                "operator": "Equal",
                "value": "spot",
                "effect": "NoSchedule",
            },
            {"operator": "Exists"},
        ],
    ),
    ("spec.workers.affinity", {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}),
    ("spec.workers.labels", {"kueue.x-k8s.io/queue-name": "team-a", "team": "a", "empty": ""}),
    ("spec.head.annotations", {"iam.gke.io/gcp-service-account": "trainer@project.iam.gserviceaccount.com"}),
    ("spec.head.serviceAccountName", "trainer.identity"),
    ("spec.workers.priorityClassName", "training-high"),
    ("spec.workers.shmSize", "64Gi"),
    ("spec.workers.gpuResource", "nvidia.com/mig-1g.10gb"),
    ("spec.checkpoint.everySteps", "auto"),
    ("spec.checkpoint.maxEverySteps", 10),
    ("metadata.name", "a" * MAX_NAME_LENGTH),
    ("metadata.name", "r2-d2-7b"),
]


@pytest.fixture(scope="module")
def crd(testbed: tb.Testbed) -> dict[str, Any]:
    """The chart's CRD file, applied and Established (it stays: other tests may use it)."""
    testbed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    testbed.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


@pytest.fixture(scope="module")
def custom_objects(kube_api: client.ApiClient, crd: dict[str, Any]) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api)


def server_dry_run(api: client.CustomObjectsApi, document: dict[str, Any]) -> ApiException | None:
    """None when the API server would create it; else the refusal."""
    try:
        api.create_namespaced_custom_object(
            API_GROUP, VERSION, "default", PLURAL, document, dry_run="All", field_validation="Strict"
        )
    except ApiException as error:
        return error
    return None


def refused_fields(error: ApiException) -> tuple[set[str], str]:
    """The fields the API server's refusal names, and its message."""
    body = json.loads(error.body or "{}")
    causes = body.get("details", {}).get("causes", [])
    return {cause.get("field", "") for cause in causes}, body.get("message", "")


def parser_problems(document: dict[str, Any]) -> list[str]:
    try:
        parse_training_run(copy.deepcopy(document))
    except InvalidSpecError as error:
        return error.problems
    return []


@pytest.mark.parametrize("case", MALFORMED, ids=[case.id for case in MALFORMED])
def test_malformed_run_is_refused_by_api_server_and_parser_on_the_same_field(
    custom_objects: client.CustomObjectsApi, case: Case
) -> None:
    error = server_dry_run(custom_objects, case.document)
    assert error is not None, f"the API server accepted it: {json.dumps(case.document)}"
    fields, message = refused_fields(error)
    # Schema and CEL errors come as causes with a field; a strict-decoding error only as a message:
    # `unknown field "spec.workers.gpus"`, or `unknown field "spec.image.x"` for a mapping given
    # where a string belongs (strict decoding runs before the type checks).
    named = case.field in fields or f'"{case.field}"' in message or f'"{case.field}.' in message
    assert named, (error.status, fields, message)
    assert case.server_says in message, message

    problems = parser_problems(case.document)
    assert any(problem.startswith(f"{case.parser_field or case.field}:") for problem in problems), problems


def test_enough_malformed_cases() -> None:
    assert len(MALFORMED) >= 100
    assert len({case.id for case in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[f"{p}={json.dumps(v)[:40]}" for p, v in ACCEPTED])
def test_valid_edge_case_is_accepted_by_both(custom_objects: client.CustomObjectsApi, path: str, value: Any) -> None:
    document = with_field(path, value, name=value if path == "metadata.name" else "fuzz")
    error = server_dry_run(custom_objects, document)
    assert error is None, refused_fields(error)
    assert parser_problems(document) == []


def get_run(testbed: tb.Testbed, namespace: str, name: str) -> dict[str, Any]:
    run: dict[str, Any] = json.loads(testbed.kubectl("get", "trainingrun", name, "-n", namespace, "-o", "json").stdout)
    return run


def test_api_server_fills_in_the_dataclass_defaults(testbed: tb.Testbed, crd: dict[str, Any], namespace: str) -> None:
    minimal = base_manifest("defaults")
    testbed.apply(minimal, namespace=namespace)

    stored = get_run(testbed, namespace, "defaults")

    def camel_tree(value: Any) -> Any:
        if isinstance(value, dict):
            # An empty list is unset (the dataclass's () default; the API server defaults no list).
            return {_camel(k): camel_tree(v) for k, v in value.items() if v is not None and v != ()}
        return value

    expected = camel_tree(dataclasses.asdict(parse_training_run(minimal).spec))
    assert stored["spec"] == expected
    assert parse_training_run(stored).spec == parse_training_run(minimal).spec


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def test_storage_uris_cannot_change_once_set(testbed: tb.Testbed, crd: dict[str, Any], namespace: str) -> None:
    run = with_field("spec.data.uri", "s3://bucket/datasets/a", name="immutable")
    testbed.apply(run, namespace=namespace)

    def apply(document: dict[str, Any]) -> str:
        result = testbed.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(document), check=False)
        return "" if result.returncode == 0 else result.stderr

    moved = copy.deepcopy(run)
    moved["spec"]["checkpoint"]["uri"] = "s3://bucket/runs/elsewhere"
    assert "checkpoint.uri cannot change: the run resumes from checkpoints there" in apply(moved)

    new_data = copy.deepcopy(run)
    new_data["spec"]["data"]["uri"] = "s3://bucket/datasets/b"
    assert "data.uri cannot change" in apply(new_data)

    no_data = copy.deepcopy(run)
    del no_data["spec"]["data"]
    assert "data.uri cannot be removed once set" in apply(no_data)

    scaled = copy.deepcopy(run)
    scaled["spec"]["workers"] = {"replicas": 4}
    assert apply(scaled) == ""
    assert get_run(testbed, namespace, "immutable")["spec"]["workers"]["replicas"] == 4


def test_unknown_fields_are_pruned_by_default_and_refused_when_strict(
    testbed: tb.Testbed, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    document = with_field("spec.workers.gpus", 1, name="typo")
    stored = cast(
        "dict[str, Any]",
        custom_objects.create_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, document),
    )
    assert "gpus" not in stored["spec"]["workers"]

    strict = testbed.kubectl(
        "apply", "--validate=strict", "--dry-run=server", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(with_field("spec.workers.gpus", 1, name="typo-2")), check=False,
    )  # fmt: skip
    assert strict.returncode != 0
    assert 'unknown field "spec.workers.gpus"' in strict.stderr


def test_kubectl_explain_teaches_the_spec(testbed: tb.Testbed, crd: dict[str, Any]) -> None:
    workers = spec_schema()["properties"]["workers"]

    # The OpenAPI document that kubectl explain reads is published a moment after Established.
    def explained() -> str | None:
        result = testbed.kubectl("explain", "trainingrun.spec.workers", check=False)
        return result.stdout if result.returncode == 0 else None

    text = " ".join(tb.wait_until("kubectl explain trainingrun", explained, timeout=60).split())
    assert " ".join(workers["description"].split()) in text
    for name, field in workers["properties"].items():
        assert name in text
        assert " ".join(field["description"].split()) in text


def test_printer_columns(testbed: tb.Testbed, crd: dict[str, Any], namespace: str) -> None:
    testbed.apply(base_manifest("columns"), namespace=namespace)
    header = testbed.kubectl("get", "tr", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert header == [
        "NAME",
        "PHASE",
        "ATTEMPT",
        "STEP",
        "TOTAL",
        "CHECKPOINT",
        "PREEMPTIONS",
        "GOODPUT",
        "FAILURES",
        "AGE",
        "MESSAGE",
    ]


def test_status_subresource_keeps_what_the_controller_writes(
    testbed: tb.Testbed, crd: dict[str, Any], namespace: str
) -> None:
    """Every status field the controller writes survives (nothing pruned), kopf's included.

    A merge patch (what kopf sends) removes a field set to null, so an attempt that started from
    scratch has no resumedFrom at all rather than resumedFrom: null."""
    testbed.apply(base_manifest("status"), namespace=namespace)
    status = {
        "phase": "Resuming",
        "attempt": 2,
        "preemptions": 1,
        "failures": 0,
        "rayJob": "status-a2",
        "message": "attempt 1 preempted at step 120; resuming from step 100",
        "nextAttemptTime": "2026-11-23T03:00:00Z",
        "observedGeneration": 1,
        "progress": {
            "step": 120,
            "totalSteps": 200,
            "loss": 2.5,
            "stepsPerSecond": 1.25,
            "updateTime": "2026-11-23T02:59:00Z",
        },
        "lastCheckpoint": {"step": 100, "uri": "s3://bucket/runs/fuzz/step-100", "time": "2026-11-23T02:58:00Z"},
        "goodput": {
            "ratio": 0.612,
            "wallSeconds": 600,
            "survivingStepSeconds": 367,
            "lostSeconds": {
                "waitingForCapacity": 60,
                "startUp": 20,
                "restarts": 90,
                "redoneSteps": 40,
                "checkpointBlocking": 3,
                "other": 20,
            },
            "stepsRedone": [20],
            "workerRestarts": 0,
        },
        "checkpointInterval": {
            "steps": 40,
            "targetSeconds": 12.5,
            "checkpointSeconds": 0.4,
            "stepSeconds": 0.31,
            "meanSecondsBetweenInterruptions": 195.3,
            "interruptions": 1,
            "observedSeconds": 30.6,
            "minSteps": 10,
            "maxSteps": 5000,
        },
        "attempts": [
            {
                "attempt": 1,
                "rayJob": "status-a1",
                "outcome": "Preempted",
                "reason": "NodePreempted",
                "message": "node spot-0 was reclaimed",
                "startTime": "2026-11-23T02:50:00Z",
                "endTime": "2026-11-23T02:59:00Z",
            },
            {
                "attempt": 2,
                "rayJob": "status-a2",
                "outcome": "Running",
                "startTime": "2026-11-23T03:00:00Z",
                "resumedFrom": 100,
            },
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Resuming",
                "message": "waiting for attempt 2",
                "lastTransitionTime": "2026-11-23T02:59:00Z",
                "observedGeneration": 1,
            }
        ],
        "kopf": {"progress": {"spotray/create": {"started": "2026-11-23T02:50:00Z", "retries": 0}}},
    }
    testbed.kubectl(
        "patch", "trainingrun", "status", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    assert get_run(testbed, namespace, "status")["status"] == status

    bad_phase = {"status": {"phase": "Sleeping"}}
    refused = testbed.kubectl(
        "patch", "trainingrun", "status", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(bad_phase), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "status.phase" in refused.stderr


def test_a_40_kb_job_detail_reaches_the_status_cut_instead_of_freezing_the_run(
    custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    """A traceback in the job's detail used to go into status unbounded: the API server refused the
    patch (422, a condition message is at most 32 kB) and the run froze. Now it is cut first."""
    custom_objects.create_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, base_manifest("long-detail"))
    run = parse_training_run(base_manifest("long-detail"))
    now = datetime.now(UTC)
    started = start_attempt(RunState(), run, now, "first attempt").state
    detail = "Traceback (most recent call last):\n" + "  File 'train.py', line 1, in loop\n" * 1200 + "ValueError: boom"
    assert len(detail) > 40_000
    ended = end_attempt(started, run, AttemptEnd("Failed", "TrainingFailed", detail), now).state
    status = {**ended.to_status(), "conditions": [c.to_status() for c in conditions(ended, [], 1, now)]}

    def patch(body: dict[str, Any]) -> None:
        custom_objects.patch_namespaced_custom_object_status(
            API_GROUP, VERSION, namespace, PLURAL, "long-detail", {"status": body}
        )

    patch(status)
    stored = cast(
        "dict[str, Any]",
        custom_objects.get_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, "long-detail"),
    )["status"]
    assert stored["phase"] == "Resuming"
    assert len(stored["message"]) <= MAX_MESSAGE_CHARS
    assert "more characters cut" in stored["attempts"][-1]["message"]
    # What the controller wrote before: the same detail uncut. The API server refuses it.
    uncut = copy.deepcopy(status)
    for condition in uncut["conditions"]:
        if condition["status"] == "True":
            condition["message"] = detail
    with pytest.raises(ApiException) as refused:
        patch(uncut)
    assert refused.value.status == 422


def test_a_status_write_for_a_deleted_run_is_refused_by_the_run_created_again_under_its_name(
    kube_api: client.ApiClient, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    """Issue #69: the controller's status patch names the resourceVersion it was computed from, and the
    real API server refuses it (409) on an object of the same name created since; a uid in a status
    patch would not do (the status subresource keeps the object's metadata)."""
    cluster = Cluster(kube_api)
    manifest = base_manifest("created-again")
    old = custom_objects.create_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, manifest)
    read = old["metadata"]["resourceVersion"]
    assert cluster.patch_run_status(namespace, "created-again", {"message": "first"}, read)
    assert not cluster.patch_run_status(namespace, "created-again", {"message": "stale"}, read)
    custom_objects.delete_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, "created-again")
    new = custom_objects.create_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, manifest)
    assert not cluster.patch_run_status(namespace, "created-again", {"message": "meant for the old one"}, read)
    stored = cast(
        "dict[str, Any]",
        custom_objects.get_namespaced_custom_object(API_GROUP, VERSION, namespace, PLURAL, "created-again"),
    )
    assert (stored.get("status") or {}).get("message") is None
    now = new["metadata"]["resourceVersion"]
    assert cluster.patch_run_status(namespace, "created-again", {"message": "its own"}, now)
