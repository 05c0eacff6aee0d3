"""The TrainingRun CRD cannot drift from spotray/contract/spec.py: same fields, same defaults, same minimums,
every field described, and the YAML in the chart is what controller/crd.py generates."""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from spotray.contract.spec import MAX_NAME_LENGTH, NAME_PATTERN, CheckpointSpec, InvalidSpecError, RunSpec, parse_spec
from spotray.contract.sweep import parse_sweep, sweep_declarations
from spotray.controller.crd import (
    CRD_PATH,
    SWEEP_CRD_PATH,
    crd_yaml,
    spec_schema,
    training_run_crd,
    training_sweep_crd,
)

pytestmark = pytest.mark.unit

MINIMAL_SPEC: dict[str, Any] = {
    "entrypoint": "python -m spotray.jobs.gpt2",
    "checkpoint": {"uri": "s3://bucket/runs/a"},
}
# The sections of spec the parser reads field by field (runtimeEnv is free-form on purpose).
SECTIONS = ["", "workers", "head", "checkpoint", "data", "retry"]


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def properties(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, schema) below schema, through objects and list items."""
    for name, child in schema.get("properties", {}).items():
        yield f"{path}.{name}".lstrip("."), child
        yield from properties(child, f"{path}.{name}".lstrip("."))
    if "items" in schema:
        yield f"{path}[]", schema["items"]
        yield from properties(schema["items"], f"{path}[]")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's defaulting does with this schema (absent fields only, then recurse)."""
    if not isinstance(value, dict):
        return value
    result = dict(value)
    for name, child in schema.get("properties", {}).items():
        if name not in result and "default" in child:
            result[name] = copy.deepcopy(child["default"])
        if name in result:
            result[name] = apply_defaults(child, result[name])
    return result


def parser_known_fields(section: str) -> set[str]:
    """The fields the parser accepts in one section, read from its own unknown-field message."""
    spec: dict[str, Any] = copy.deepcopy(MINIMAL_SPEC)
    target = spec.setdefault(section, {}) if section else spec
    target["zzUnknown"] = 1
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec)
    where = f"spec.{section}.zzUnknown" if section else "spec.zzUnknown"
    (problem,) = [p for p in caught.value.problems if p.startswith(f"{where}:")]
    match = re.search(r"\(known: (.*)\)$", problem)
    assert match, problem
    return set(match.group(1).split(", "))


def schema_section(section: str) -> dict[str, Any]:
    schema = spec_schema()
    return schema["properties"][section] if section else schema


def test_committed_yaml_is_generated_from_the_code() -> None:
    assert CRD_PATH.exists(), f"{CRD_PATH} is missing: run `make crd`"
    assert CRD_PATH.read_text() == crd_yaml(), f"{CRD_PATH} is stale: run `make crd` and commit the result"
    assert yaml.safe_load(CRD_PATH.read_text()) == training_run_crd()


def test_the_committed_sweep_crd_is_generated_and_its_spec_has_the_parsers_sections() -> None:
    assert SWEEP_CRD_PATH.read_text() == crd_yaml(training_sweep_crd()), f"{SWEEP_CRD_PATH} is stale: run `make crd`"
    schema = training_sweep_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    # The same sections parse_sweep reads (its unknown-field check names them), the template the run's own schema.
    assert set(spec) == {
        "template", "parameters", "search", "objective", "trials", "earlyStopping", "populationBased"
    }  # fmt: skip
    assert spec["template"]["properties"] == spec_schema()["properties"]
    # The example sweep passes the parser; its numbers fall in the schema's ranges.
    example = yaml.safe_load((CRD_PATH.parents[3] / "jobs/gpt2/sweep.yaml").read_text())
    for section in ("trials", "earlyStopping"):
        for key, value in example["spec"].get(section, {}).items():
            bounds = spec[section]["properties"][key]
            assert bounds["minimum"] <= value <= bounds["maximum"], (section, key, value)
    # Every default the parser falls back to is the schema's default: one declaration for both.
    parsed = parse_sweep(example).spec
    for section, read in (("search", parsed.search), ("objective", parsed.objective), ("trials", parsed.trials)):
        for key, section_field, _ in sweep_declarations(type(read)):
            if key not in example["spec"].get(section, {}) and "default" in spec[section]["properties"][key]:
                assert getattr(read, section_field.name) == spec[section]["properties"][key]["default"], (section, key)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s or "spec")
def test_schema_fields_are_the_fields_the_parser_accepts(section: str) -> None:
    assert set(schema_section(section)["properties"]) == parser_known_fields(section)


def test_schema_fields_are_the_dataclass_fields() -> None:
    def dataclass_paths(cls: type[Any], prefix: str = "") -> set[str]:
        paths = set()
        hints = typing.get_type_hints(cls)
        for spec_field in dataclasses.fields(cls):
            path = prefix + camel(spec_field.name)
            paths.add(path)
            if dataclasses.is_dataclass(hints[spec_field.name]):
                paths |= dataclass_paths(hints[spec_field.name], f"{path}.")
        return paths

    # A list's items (a toleration's fields) are Kubernetes' declaration, not spotray's.
    schema_paths = {
        path for path, _ in properties(spec_schema()) if not path.startswith("runtimeEnv.") and "[]" not in path
    }
    assert schema_paths == dataclass_paths(RunSpec)


def test_schema_defaults_are_the_dataclass_defaults() -> None:
    defaulted = apply_defaults(spec_schema(), MINIMAL_SPEC)
    dataclass_defaults = RunSpec(
        entrypoint=MINIMAL_SPEC["entrypoint"], checkpoint=CheckpointSpec(uri="s3://bucket/runs/a")
    )

    def camel_tree(value: Any) -> Any:
        if isinstance(value, dict):
            # An empty list is unset (the dataclass's () default; the API server defaults no list).
            return {camel(k): camel_tree(v) for k, v in value.items() if v is not None and v != ()}
        return value

    assert defaulted == camel_tree(dataclasses.asdict(dataclass_defaults))
    assert parse_spec(defaulted) == parse_spec(MINIMAL_SPEC) == dataclass_defaults


def test_every_default_is_valid_for_the_parser() -> None:
    """A default the parser would refuse (e.g. a quantity it cannot read) is caught here."""
    parse_spec(apply_defaults(spec_schema(), MINIMAL_SPEC))


@pytest.mark.parametrize(
    "path",
    [path for path, schema in properties(spec_schema()) if "minimum" in schema],
)
def test_schema_minimums_are_the_parser_minimums(path: str) -> None:
    minimum = dict(properties(spec_schema()))[path]["minimum"]
    *sections, name = path.split(".")
    # The one rule across fields: minEverySteps <= maxEverySteps; at the minimum, both are 1.
    others = {"minEverySteps": 1} if name == "maxEverySteps" else {}

    def spec_with(value: int) -> dict[str, Any]:
        spec = copy.deepcopy(MINIMAL_SPEC)
        section = spec
        for part in sections:
            section = section.setdefault(part, {})
        section.update({**others, name: value})
        return spec

    parse_spec(spec_with(minimum))
    too_small = spec_with(minimum - 1)
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(too_small)
    assert caught.value.problems == [f"spec.{path}: must be >= {minimum}, got {minimum - 1}"]


def test_every_property_has_a_description() -> None:
    root = training_run_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # metadata is the one exception: the API server refuses anything but name rules there.
    described = [(path, schema) for path, schema in properties(root) if not path.startswith("metadata")]
    missing = [path for path, schema in described if not schema.get("description", "").strip()]
    assert missing == []


def test_required_fields_are_the_ones_without_a_default() -> None:
    schema = spec_schema()
    assert schema["required"] == ["entrypoint", "checkpoint"]
    assert schema["properties"]["checkpoint"]["required"] == ["uri"]


def test_status_is_a_defined_schema_with_standard_conditions() -> None:
    version = training_run_crd()["spec"]["versions"][0]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    assert status["properties"]["kopf"]["x-kubernetes-preserve-unknown-fields"] is True
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["properties"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Step"] == ".status.progress.step"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_the_trainingrun_reference_in_docs_is_generated_from_the_crd() -> None:
    from spotray.controller.crd import REFERENCE_PATH, reference_markdown  # noqa: PLC0415

    assert REFERENCE_PATH.read_text() == reference_markdown(), "docs/trainingrun.md is stale: run `make crd`"
    assert "`spec.retry.maxFailures`" in reference_markdown()


def test_the_name_rules_are_the_contracts_and_say_the_limit_and_why() -> None:
    """The API server refuses a name the parser refuses, saying what KubeRay would have refused later."""
    root = training_run_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = {rule["rule"]: rule for rule in root["x-kubernetes-validations"]}
    length = rules[f"size(self.metadata.name) <= {MAX_NAME_LENGTH}"]
    assert length["message"].startswith(f"metadata.name must be at most {MAX_NAME_LENGTH} characters")
    assert "refuses RayJob names over 47" in length["message"]  # KubeRay v1.6.1's MaxRayJobNameLength
    cel = next(rule for rule in rules if rule.startswith("self.metadata.name.matches("))
    assert cel == f'self.metadata.name.matches("{NAME_PATTERN.pattern}")'  # JSON's escapes: none in it
    assert "DNS-1035" in rules[cel]["message"]
    # The pattern (RE2 in the API server, the same syntax here) is a DNS-1035 label, as KubeRay wants.
    pattern = re.compile(NAME_PATTERN.pattern)
    assert [name for name in ("0-numeric-start", "7b", "-a", "a-", "a.b", "A") if pattern.match(name)] == []
    assert all(pattern.match(name) for name in ("a", "gpt2-demo", "r-7b"))
    assert {rule["fieldPath"] for rule in rules.values()} == {".metadata.name"}
    # docs/trainingrun.md says the same.
    from spotray.controller.crd import reference_markdown  # noqa: PLC0415

    for rule in (length, rules[cel]):
        assert rule["message"].replace("<", "\\<") in reference_markdown()
