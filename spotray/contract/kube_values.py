"""Kubernetes' own rules for the values a TrainingRun hands to its pods (spec.head and spec.workers:
node selectors, labels, annotations, tolerations, names, a resource name): the parser (spec.py)
refuses what the API server would refuse in the RayJob, at once and with the field's path, and the
CRD (controller/crd.py) carries the same patterns. k8s.io/apimachinery/pkg/util/validation says them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from spotray.contract.errors import unknown_field

# A qualified name: an optional DNS-1123 subdomain prefix and '/', then a name of at most 63
# characters (letters, digits, '-', '_', '.'; a letter or digit at each end). Label and annotation
# keys, and extended resource names (nvidia.com/gpu), are these.
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME_PATTERN = rf"^({DNS_SUBDOMAIN}/)?{_NAME}$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = rf"^{DNS_SUBDOMAIN}$"
MAX_DNS_SUBDOMAIN_LENGTH = 253
MAX_ANNOTATION_VALUE_LENGTH = 4096
# Labels spotray and KubeRay set on the pods (the run, the attempt, the Ray node type): a pod label of
# the run's under these would hide its pods from the controller or from KubeRay.
RESERVED_LABEL_PREFIXES = ("spotray.dev/", "ray.io/")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")

QUALIFIED_NAME_RULE = (
    "be a qualified name: an optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_' or '.' "
    "starting and ending with a letter or digit, e.g. nvidia.com/gpu.product"
)
LABEL_VALUE_RULE = "be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
DNS_SUBDOMAIN_RULE = (
    f"be a DNS subdomain of at most {MAX_DNS_SUBDOMAIN_LENGTH} characters: lowercase letters, digits, '-' and '.'"
)


def qualified_name_problem(key: object) -> str | None:
    if isinstance(key, str) and re.match(QUALIFIED_NAME_PATTERN, key) and len(key.split("/")[0]) <= 253:
        return None
    return f"must {QUALIFIED_NAME_RULE}; got {key!r}"


def label_value_problem(value: object) -> str | None:
    if isinstance(value, str) and value and re.match(LABEL_VALUE_PATTERN, value):
        return None
    return f"must {LABEL_VALUE_RULE}; got {value!r}"


def dns_subdomain_problem(name: object) -> str | None:
    if isinstance(name, str) and len(name) <= MAX_DNS_SUBDOMAIN_LENGTH and re.match(DNS_SUBDOMAIN_PATTERN, name):
        return None
    return f"must {DNS_SUBDOMAIN_RULE}; got {name!r}"


def string_map_problems(value: Mapping[Any, Any], path: str, *, label_values: bool, reserved: bool) -> list[str]:
    """Each entry of a node selector, label or annotation map whose key or value Kubernetes refuses."""
    problems = []
    for key, item in value.items():
        musts = []
        key_problem = qualified_name_problem(key)
        if key_problem is not None:
            musts.append(f"the key {key_problem}")
        elif reserved and str(key).startswith(RESERVED_LABEL_PREFIXES):
            musts.append(
                f"the key must not start with {' or '.join(RESERVED_LABEL_PREFIXES)}: spotray and KubeRay set those"
            )
        if not isinstance(item, str):
            musts.append(f"the value must be a string (quote it in YAML), got {item!r}")
        elif label_values and not re.match(LABEL_VALUE_PATTERN, item):
            musts.append(f"the value must {LABEL_VALUE_RULE}; got {item!r}")
        elif len(item) > MAX_ANNOTATION_VALUE_LENGTH:
            musts.append(f"the value must be at most {MAX_ANNOTATION_VALUE_LENGTH} characters")
        if musts:
            problems.append(f"{path}.{key}: {'; and '.join(musts)}")
    return problems


def toleration_problems(item: object, path: str) -> list[str]:
    """What Kubernetes would refuse in one toleration (core/v1 Toleration)."""
    if not isinstance(item, dict):
        return [f"{path}: must be a toleration mapping (key, operator, value, effect), got {item!r}"]
    problems = [unknown_field(f"{path}.{key}", key, TOLERATION_KEYS) for key in item if key not in TOLERATION_KEYS]
    operator = item.get("operator", "Equal")
    if operator not in TOLERATION_OPERATORS:
        problems.append(f"{path}.operator: must be one of {', '.join(TOLERATION_OPERATORS)}, got {operator!r}")
    effect = item.get("effect")
    if effect is not None and effect not in TOLERATION_EFFECTS:
        problems.append(f"{path}.effect: must be one of {', '.join(TOLERATION_EFFECTS)}, got {effect!r}")
    key = item.get("key")
    if key is not None and (key_problem := qualified_name_problem(key)) is not None:
        problems.append(f"{path}.key: {key_problem}")
    if key is None and operator != "Exists":
        problems.append(f"{path}.key: missing; a toleration without a key must have operator Exists")
    value = item.get("value")
    if value is not None and (not isinstance(value, str) or (operator == "Exists" and value)):
        problems.append(f"{path}.value: must be a string, and empty with operator Exists; got {value!r}")
    seconds = item.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        problems.append(f"{path}.tolerationSeconds: must be an integer, got {seconds!r}")
    return problems
