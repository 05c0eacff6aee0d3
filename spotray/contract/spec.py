"""The TrainingRun spec as typed data, declared once: the model, its codec and its limits.

Each field is declared once, on these frozen dataclasses, with its default and a ``SpecField``
(description, minimum, what kind of value it is). Everything else is derived from the
declarations:

- ``parse_spec`` reads a TrainingRun's camelCase ``spec`` into the dataclasses, with every default
  filled in and every problem reported at once, each with its field path and the fix;
- ``encode_spec`` writes them back as the same camelCase mapping; ``SPOTRAY_RUN`` (``RunContext``)
  carries that form to the job, which reads it with ``parse_spec``, so the spec crosses a process
  boundary in one encoded form and is checked the same way on both sides;
- the CRD (controller/crd.py) and docs/trainingrun.md are generated from the same fields: names,
  types, defaults, minimums, descriptions;
- the example jobs' hand-start flags take their defaults and help from them (jobs/common.py).

``spec.secretEnv`` holds references only (``{HF_TOKEN: hf-token/token}``, never a value), so the
spec, and ``SPOTRAY_RUN`` with it, can go anywhere: the kubelet reads the Secrets (controller/rayjob.py),
and local mode takes the values from its own environment (spotray/local/local_run.py).

Standard library and PyYAML only: the controller decides with it without boto3, torch or Ray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spotray.contract.attempts import AttemptId, check_run_id
from spotray.contract.errors import SpotrayError, unknown_field
from spotray.contract.kube_values import (
    dns_subdomain_problem,
    label_value_problem,
    qualified_name_problem,
    string_map_problems,
    toleration_problems,
)
from spotray.contract.names import (
    API_VERSION,
    DEFAULT_CHECKPOINT_KEY_SECRET,
    KIND,
    MAX_RAYJOB_NAME_LENGTH,
    MAX_RESERVED_ATTEMPT,
    SWEEP_KIND,
    SWEEP_LABEL,
    rayjob_name,
)
from spotray.contract.uris import parse_uri

RUN_ENV_VAR = "SPOTRAY_RUN"
# The CRD (controller/crd.py) reuses these, so the API server and this parser agree.
# A TrainingRun's name must make names KubeRay accepts (spotray/contract/names.py): a DNS-1035 label (a
# lowercase letter first, no '.'), as KubeRay wants the RayJob <name>-a<N>, its RayCluster and their
# Services to be, and short enough that the RayJob of every attempt up to MAX_RESERVED_ATTEMPT (3 digits)
# has at most MAX_RAYJOB_NAME_LENGTH characters: 47 - len("-a999") = 42. It is a Ray run name and in S3 keys too.
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = MAX_RAYJOB_NAME_LENGTH - len(rayjob_name("", MAX_RESERVED_ATTEMPT))
# What each rule says where it refuses a name: the API server (the CRD's rules) and this parser.
NAME_LENGTH_RULE = (
    f"be at most {MAX_NAME_LENGTH} characters: KubeRay names attempt N's RayJob <name>-aN and refuses RayJob "
    f"names over {MAX_RAYJOB_NAME_LENGTH} characters ({MAX_NAME_LENGTH} leaves room for attempt {MAX_RESERVED_ATTEMPT})"
)
NAME_PATTERN_RULE = (
    "start with a lowercase letter and hold only lowercase letters, digits and '-', ending in a letter or digit: "
    "KubeRay wants DNS-1035 labels for the RayJob <name>-aN, its RayCluster and their Services"
)
CPU_PATTERN = re.compile(r"^(\d+(\.\d+)?)(m?)$")
CHECKPOINT_DIR_NAME = re.compile(r"^checkpoint-[0-9]+$")
MEMORY_PATTERN = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
AUTO = "auto"

# What kind of value a field holds: how this parser checks it, and which rules the CRD adds.
CPU, MEMORY, URI, TEXT, STEPS_OR_AUTO = "cpu", "memory", "uri", "text", "steps-or-auto"
ENV_FROM_SECRETS = "env-from-secrets"  # a map of environment variable -> SECRET/KEY
# Values handed to the pods as they are, under Kubernetes' own rules (spotray/contract/kube_values.py):
NODE_LABELS = "node-labels"  # a node selector: label keys and values
POD_LABELS = "pod-labels"  # labels on the run's pods: not under spotray's or KubeRay's prefixes
ANNOTATIONS = "annotations"
TOLERATIONS = "tolerations"  # a list of core/v1 Tolerations
NAME = "name"  # a DNS subdomain: a Secret's, a ServiceAccount's or a PriorityClass's name
RESOURCE_NAME = "resource-name"  # an extended resource, e.g. nvidia.com/gpu
LABEL_VALUE = "label-value"  # a label's value: a Kueue queue's name
MAX_PLACEMENT_ITEMS = 64

# spec.secretEnv: each variable of the job's environment that a Secret's key supplies. The CRD
# (controller/crd.py) turns these patterns and limits into its rules, so the API server refuses
# what this parser refuses. Kubernetes' own rules: a Secret's name is a DNS-1123 subdomain, and a
# key is [-._a-zA-Z0-9]+ but not ".", ".." or "..anything" (hence the key pattern's one optional
# leading dot), each at most 253 characters. Neither holds a '/', so SECRET/KEY splits one way only.
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_CONFIG_MAP_KEY = r"\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*"
SECRET_REF_PATTERN = re.compile(rf"^{_DNS_1123_LABEL}(\.{_DNS_1123_LABEL})*/{_CONFIG_MAP_KEY}$")
MAX_SECRET_NAME_LENGTH = MAX_SECRET_KEY_LENGTH = 253
SECRET_REF_LENGTH_PATTERN = re.compile(rf"^[^/]{{1,{MAX_SECRET_NAME_LENGTH}}}/[^/]{{1,{MAX_SECRET_KEY_LENGTH}}}$")
MAX_SECRET_REF_LENGTH = MAX_SECRET_NAME_LENGTH + 1 + MAX_SECRET_KEY_LENGTH
MAX_ENV_NAME_LENGTH = 128
# Names the job's environment gets from spotray, KubeRay or Ray: a Secret's value under one of them
# would be overwritten, or overwrite what they rely on. SPOTRAY_RUN, SPOTRAY_EVENTS; RAY_* (KubeRay
# and Ray: RAY_ADDRESS, RAY_IP, ...); AWS_* (the checkpoint Secret, envFrom, which an env item would
# override; AWS_ENDPOINT_URL); KUBERAY_GEN_RAY_START_CMD. Then the single names: KubeRay's head
# address and Redis credentials; controller/rayjob.py's S3 endpoint for MosaicML streaming; Ray
# Train's torch.distributed variables; what local mode sets for its driver and Ray (spotray/local/local_run.py,
# spotray/local/local_ray.py). tests/unit/test_secret_env.py checks the RayJob's and local mode's names against them.
RESERVED_ENV_PREFIXES = ("SPOTRAY_", "RAY_", "AWS_", "KUBERAY_")
RESERVED_ENV_NAMES = (
    "FQ_RAY_IP",
    "REDIS_PASSWORD",
    "REDIS_USERNAME",
    "S3_ENDPOINT_URL",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "PATH",
    "PYTHONUNBUFFERED",
    "GLOO_SOCKET_IFNAME",
)
# What each rule says where it refuses an entry: the API server (the CRD's rules) and this parser.
ENV_NAME_RULE = (
    f"be a C identifier of at most {MAX_ENV_NAME_LENGTH} characters (letters, digits and '_', not starting "
    "with a digit), e.g. HF_TOKEN"
)
RESERVED_ENV_RULE = (
    f"not start with {', '.join(RESERVED_ENV_PREFIXES)} nor be {', '.join(RESERVED_ENV_NAMES)}: spotray, KubeRay "
    "or Ray set those in the job's environment (AWS_*: the checkpoint Secret); give the variable another name"
)
SECRET_REF_RULE = (
    "be SECRET/KEY: a Secret of the run's namespace (lowercase letters, digits, '-' and '.', a DNS-1123 "
    f"subdomain) and one of its keys (letters, digits, '-', '_' and '.', not '.' or '..'), each at most "
    f"{MAX_SECRET_NAME_LENGTH} characters, e.g. hf-token/token"
)


class InvalidSpecError(SpotrayError):
    """A TrainingRun that cannot run; ``problems`` lists every field that is wrong."""

    def __init__(self, problems: list[str], where: str = "TrainingRun") -> None:
        self.problems = problems
        self.where = where
        listing = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(
            f"{where} is not valid:\n{listing}",
            "edit the manifest as each line says; `kubectl explain trainingrun.spec` describes every field",
        )

    def __reduce__(self) -> tuple[type[InvalidSpecError], tuple[list[str], str]]:  # type: ignore[override]
        return (type(self), (self.problems, self.where))


@dataclass(frozen=True)
class SpecField:
    """What the declaration of one spec field says beyond its Python type and default."""

    description: str  # `kubectl explain` and docs/trainingrun.md print it
    minimum: int | None = None
    kind: str | None = None  # CPU, MEMORY, URI, TEXT, STEPS_OR_AUTO or ENV_FROM_SECRETS
    max_length: int | None = None  # for the API server's CEL cost estimates
    immutable: str | None = None  # why the value cannot change once set
    when_missing: str | None = None  # a required field: what to write
    max_items: int | None = None  # the most entries of a mapping
    choices: tuple[str, ...] | None = None  # the only values a string may take


def spec_field(description: str, *, default: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A dataclass field of the spec, with its ``SpecField``; a dataclass default means a section."""
    metadata = {"spec": SpecField(description, **declared)}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declaration(cls: type[Any], name: str) -> SpecField:
    """The ``SpecField`` of ``cls.name``."""
    declared: SpecField = next(f for f in dataclasses.fields(cls) if f.name == name).metadata["spec"]
    return declared


def default_of(cls: type[Any], name: str) -> Any:
    """The declared default of ``cls.name``, None for a required field (a flag that stands for it uses it)."""
    default = next(f for f in dataclasses.fields(cls) if f.name == name).default
    return None if default is dataclasses.MISSING else default


def camel(name: str) -> str:
    """A dataclass field's key in the manifest: ``min_every_steps`` -> ``minEverySteps``."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def split_secret_ref(ref: str) -> tuple[str, str]:
    """A ``spec.secretEnv`` value, ``SECRET/KEY``, as (the Secret's name, the key)."""
    secret, _, key = ref.partition("/")
    return secret, key


def reserved_env_name(name: str) -> bool:
    """Whether spotray, KubeRay or Ray set ``name`` in the job's environment (see RESERVED_ENV_NAMES)."""
    return name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES


def parse_cpu(text: str) -> float:
    """A Kubernetes CPU quantity ("2", "0.5", "500m") as a number of cores."""
    match = CPU_PATTERN.match(text.strip())
    if not match:
        raise ValueError(f'{text!r} is not a CPU quantity (write e.g. "2", "0.5" or "500m")')
    value = float(match.group(1))
    return value / 1000 if match.group(3) else value


@dataclass(frozen=True)
class PodPlacement:
    """Where a group's pods go and what they carry, declared once for the head and the workers; each
    adds to (or, where it says so, replaces) what the chart sets for every run (controller/rayjob.py)."""

    node_selector: dict[str, str] = spec_field(
        "Node labels the pods must have, added to the chart's for the group (ray.head.nodeSelector, or "
        "ray.workers.nodeSelector for spot workers: the capacity's labels); a key the chart sets too takes "
        "this value. E.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}.",
        default={},
        kind=NODE_LABELS,
        max_items=MAX_PLACEMENT_ITEMS,
    )
    tolerations: tuple[dict[str, Any], ...] = spec_field(
        "Taints the pods tolerate, besides the chart's for the group (core/v1 Tolerations: key, operator, "
        "value, effect, tolerationSeconds).",
        default=(),
        kind=TOLERATIONS,
        max_items=MAX_PLACEMENT_ITEMS,
    )
    affinity: dict[str, Any] = spec_field(
        "A Kubernetes affinity for the pods (nodeAffinity, podAffinity, podAntiAffinity), as in a pod spec; "
        "the API server checks it when the RayJob is made. The workers' spread over nodes (with spareReplicas) "
        "is added to its podAntiAffinity.",
        default={},
    )
    service_account_name: str | None = spec_field(
        "The ServiceAccount the pods run as, for a cloud identity (IRSA or EKS Pod Identity, GKE and AKS "
        "Workload Identity). Its API token is not mounted: the pods never call the API server. Unset: the "
        "chart's ray.serviceAccountName, else the namespace's default.",
        default=None,
        kind=NAME,
    )
    priority_class_name: str | None = spec_field(
        "The pods' PriorityClass (which pods the scheduler preempts for which). Unset: the chart's "
        "ray.priorityClassName, else the cluster's default.",
        default=None,
        kind=NAME,
    )
    labels: dict[str, str] = spec_field(
        "Labels on the pods, beside spotray's and KubeRay's (keys under spotray.dev/ and ray.io/ are theirs).",
        default={},
        kind=POD_LABELS,
        max_items=MAX_PLACEMENT_ITEMS,
    )
    annotations: dict[str, str] = spec_field(
        "Annotations on the pods (e.g. karpenter.sh/do-not-disrupt, a cloud's network or identity settings).",
        default={},
        kind=ANNOTATIONS,
        max_items=MAX_PLACEMENT_ITEMS,
    )
    shm_size: str | None = spec_field(
        "Size of the pods' /dev/shm, a memory-backed volume NCCL and DataLoader workers need more of than a "
        "container's 64 MB, e.g. \"16Gi\"; it counts against the pod's memory limit. Unset: the chart's "
        "ray.shmSize, else the container runtime's.",
        default=None,
        kind=MEMORY,
    )


# spec.workers.capacity: where the workers run.
SPOT, ON_DEMAND, SPOT_THEN_ON_DEMAND = "spot", "on-demand", "spot-then-on-demand"
CAPACITY_POLICIES = (SPOT, ON_DEMAND, SPOT_THEN_ON_DEMAND)


@dataclass(frozen=True)
class CapacityFallback:
    """With ``capacity: spot-then-on-demand``: when the workers move to on-demand nodes, and back
    (spotray/decisions/capacity_policy.py)."""

    after_wait_seconds: int = spec_field(
        "An attempt whose spot workers wait this long for capacity (unschedulable) ends, spending no budget, "
        "and the next attempt runs its workers on on-demand nodes.",
        default=600,
        minimum=1,
    )
    after_preemptions: int | None = spec_field(
        "This many spot reclaims (preemptions of spot workers; not an eviction of on-demand nodes or "
        "of the Ray head, nor a queue's) within withinSeconds: the next attempt runs on on-demand nodes. "
        "Unset: preemptions alone never move the run.",
        default=None,
        minimum=1,
    )
    within_seconds: int = spec_field("The window afterPreemptions counts in.", default=3600, minimum=1)


@dataclass(frozen=True)
class WorkerSpec(PodPlacement):
    """The Ray worker group: ``replicas`` pods, each running one training worker per GPU (or one on CPU).

    With ``min_replicas`` below ``replicas`` the run is elastic: it goes on with as few as
    ``min_replicas`` pods when spot nodes are lost, and grows back as they return.
    """

    replicas: int = spec_field(
        "Number of worker pods. Ray Train runs replicas * max(gpu, 1) workers.", default=2, minimum=1
    )
    cpu: str = spec_field(
        'CPU request per worker pod, a Kubernetes quantity: "2", "0.5" or "500m".', default="1", kind=CPU
    )
    memory: str = spec_field(
        'Memory request per worker pod, a Kubernetes quantity: "4Gi" or "512Mi".', default="4Gi", kind=MEMORY
    )
    gpu: int = spec_field("GPUs per worker pod (of gpuResource); 0 trains on CPU.", default=0, minimum=0)
    gpu_resource: str | None = spec_field(
        "The extended resource a GPU is, e.g. amd.com/gpu, or a MIG slice such as nvidia.com/mig-1g.10gb. "
        "Unset: the chart's ray.gpuResource (nvidia.com/gpu).",
        default=None,
        kind=RESOURCE_NAME,
    )
    spot: bool = spec_field(
        "Schedule workers on spot (preemptible) nodes. Preemptions are retried up to "
        "retry.maxPreemptions times, resuming from the latest checkpoint.",
        default=True,
    )
    capacity: str | None = spec_field(
        "Where the workers run: spot, on-demand, or spot-then-on-demand (on spot nodes, on on-demand ones "
        "while spot is short, as fallback says; back on spot at the next attempt once a spot node can take "
        "them). Status.attempts[].capacity says where each attempt ran, status.cost what it cost. Unset: "
        "spot when spot is true (the default), else on-demand.",
        default=None,
        choices=CAPACITY_POLICIES,
    )
    fallback: CapacityFallback = spec_field(
        "With capacity spot-then-on-demand: when the workers move to on-demand nodes.", default=CapacityFallback
    )
    min_replicas: int | None = spec_field(
        "The fewest worker pods the run goes on with. Below replicas the run is elastic: when "
        "spot nodes are lost it continues on the pods that are left, and grows back as nodes return, each "
        "time from the latest checkpoint, with the same global batch (gradient accumulation makes up the "
        "difference). Every worker count in the range must divide the global batch. Unset: replicas.",
        default=None,
        minimum=1,
    )
    spare_replicas: int = spec_field(
        "Worker pods kept up beside the run's replicas, idle until a spot notice takes a worker's node: "
        "the run then goes on at once on a spare, in the same attempt, from the notice's emergency "
        "checkpoint, instead of stopping and waiting for a new node. Each costs a node of the workers' pool; "
        "the worker pods are then asked to go on different nodes (preferred), so one reclaim takes one of them; "
        "with the chart's controller.rayClusterPerRun, a spare that lands beside a training worker is moved.",
        default=0,
        minimum=0,
    )

    def problems(self, path: str) -> list[str]:
        problems = []
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            problems.append(
                f"{path}.minReplicas: must be <= replicas ({self.replicas}), got {self.min_replicas}; "
                "replicas is the most pods the run uses, minReplicas the fewest it goes on with"
            )
        if self.capacity is not None and not self.spot and self.capacity != ON_DEMAND:
            problems.append(
                f"{path}.capacity: {self.capacity} with spot: false; spot is the older way to say "
                "capacity: remove it and keep capacity"
            )
        return problems

    @property
    def capacity_policy(self) -> str:
        """spot, on-demand or spot-then-on-demand: ``capacity``, or what ``spot`` says."""
        return self.capacity or (SPOT if self.spot else ON_DEMAND)

    def on_spot(self, capacity: str | None) -> bool:
        """Whether an attempt on ``capacity`` (spot or on-demand; None: not recorded, the policy's
        first) runs its workers on spot nodes."""
        return capacity == SPOT if capacity is not None else self.capacity_policy != ON_DEMAND

    @property
    def workers_per_replica(self) -> int:
        return max(self.gpu, 1)

    @property
    def num_workers(self) -> int:
        """The most training workers: every replica up."""
        return self.replicas * self.workers_per_replica

    @property
    def min_workers(self) -> int:
        """The fewest training workers the run goes on with."""
        return (self.min_replicas or self.replicas) * self.workers_per_replica

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.num_workers

    @property
    def pods(self) -> int:
        """The worker pods the Ray cluster keeps up: the run's replicas and its spares."""
        return self.replicas + self.spare_replicas

    @property
    def worker_counts(self) -> range:
        """Every number of training workers the run may have: each must split the global batch."""
        return range(self.min_workers, self.num_workers + 1, self.workers_per_replica)

    @property
    def cpu_per_worker(self) -> float:
        return parse_cpu(self.cpu) / self.workers_per_replica


@dataclass(frozen=True)
class HeadSpec(PodPlacement):
    cpu: str = spec_field(
        'CPU request of the head pod, a Kubernetes quantity: "2", "0.5" or "500m".', default="1", kind=CPU
    )
    memory: str = spec_field(
        'Memory request of the head pod, a Kubernetes quantity: "4Gi" or "512Mi".', default="4Gi", kind=MEMORY
    )


def start_from_problems(start_from: str, uri: str, path: str) -> list[str]:
    """What is wrong with ``checkpoint.startFrom``: it names one checkpoint directory of another run."""
    name = start_from.rstrip("/").rsplit("/", 1)[-1]
    if not CHECKPOINT_DIR_NAME.match(name):
        return [f"{path}: must end with a checkpoint's directory, checkpoint-<step>, got {start_from!r}"]
    try:
        source, own = parse_uri(start_from), parse_uri(uri)
    except SpotrayError:
        return []  # the URI's own problem is reported by its kind
    same_store = source.scheme == own.scheme and source.bucket == own.bucket
    if same_store and (not own.prefix or source.prefix.startswith(own.prefix + "/")):
        return [f"{path}: {start_from} is under this run's own checkpoint.uri; name another run's checkpoint"]
    return []


@dataclass(frozen=True)
class CheckpointSpec:
    uri: str = spec_field(
        "Where checkpoints are written: s3://BUCKET/PREFIX, or a path on a volume every pod mounts "
        "(/mnt/shared/runs/x or file:///mnt/shared/runs/x). Cannot change once set.",
        kind=URI,
        immutable="the run resumes from checkpoints there",
        when_missing="write where checkpoints go, e.g. s3://BUCKET/PREFIX",
    )
    every_steps: int | str = spec_field(
        "Take a checkpoint every this many training steps (also one on a spot notice), or auto: "
        "the interval that maximises expected goodput from the measured checkpoint cost and the observed "
        "interruption rate (Young/Daly), within minEverySteps and maxEverySteps; status.checkpointInterval "
        "shows the choice and its numbers.",
        default=100,
        minimum=1,
        kind=STEPS_OR_AUTO,  # AUTO: chosen while training (train/hf/checkpoint_interval.py)
    )
    min_every_steps: int = spec_field(
        "With everySteps: auto, the shortest interval it may choose.", default=10, minimum=1
    )
    max_every_steps: int = spec_field(
        "With everySteps: auto, the longest interval it may choose.", default=5000, minimum=1
    )
    keep: int = spec_field(
        "How many complete checkpoints to keep; older ones are deleted after a newer one completes.",
        default=3,
        minimum=1,
    )
    node_copies: int = spec_field(
        "On several nodes: how many of the newest checkpoints each node keeps in its work directory and sends "
        "to the next node while they upload, so that a resume reads what the nodes still hold from them, not "
        "from S3; every byte is checked against the signed manifest either way (docs/resume.md). Each kept "
        "checkpoint costs its size twice over the nodes' work directories (host memory when they are tmpfs). "
        "0: none.",
        default=1,
        minimum=0,
    )
    secret_ref: str | None = spec_field(
        "Name of a Secret in the run's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(and optionally AWS_ENDPOINT_URL, AWS_REGION) for the S3 store. Unset: the pods' own credentials.",
        default=None,
        kind=NAME,
    )

    key_secret: str | None = spec_field(
        "With the chart's checkpointKeys on: the Secret in the run's namespace whose `key` signs this run's "
        "checkpoints and checks those it resumes from. Unset: spotray-checkpoint-key, one key for all the "
        "namespace's runs, made by the controller for the first run that needs it and kept when runs are "
        "deleted, so that a run created again on the same URI resumes, and warm starts and a sweep's trials "
        "check each other's checkpoints. Name another to share a key with runs of another namespace (make "
        "the Secret yourself: `kubectl create secret generic NAME --from-literal=key=$(openssl rand -hex 32)`), "
        "or to keep the key of a run begun when each run had its own (<run>-checkpoint-key).",
        default=None,
        kind=NAME,
    )
    start_from: str | None = spec_field(
        "Start from another run's checkpoint: the URI of its checkpoint-<step> directory, e.g. "
        "s3://BUCKET/runs/other/checkpoint-40 (the same store and checkpoint key as this run's: with keySecret "
        "unset, any run of the namespace). The next attempt "
        "copies it into this run's prefix, verified against its manifest, in place of this run's own "
        "checkpoints, and resumes from it (when it was pruned since, from that run's newest complete "
        "checkpoint after it). Done once per value: later attempts resume from this run's own newest. "
        "Population-based training sets it on a trial that exploits another (docs/sweeps.md).",
        default=None,
        kind=URI,
    )

    def problems(self, path: str) -> list[str]:
        found = []
        if 1 <= self.max_every_steps < self.min_every_steps:  # (a bound below 1 is reported on its own)
            found.append(
                f"{path}.maxEverySteps: must be >= minEverySteps ({self.min_every_steps}), got {self.max_every_steps}"
            )
        if self.start_from is not None:
            found += start_from_problems(self.start_from, self.uri, f"{path}.startFrom")
        return found

    @property
    def auto_interval(self) -> bool:
        return self.every_steps == AUTO

    @property
    def fixed_every_steps(self) -> int | None:
        """The fixed interval; None with everySteps: auto."""
        return None if isinstance(self.every_steps, str) else self.every_steps


@dataclass(frozen=True)
class DataSpec:
    uri: str | None = spec_field(
        "Where the dataset is: s3://BUCKET/PREFIX or an absolute path. Cannot change once set: "
        "the data position saved in each checkpoint refers to this dataset.",
        default=None,
        kind=URI,
        immutable="the data position in each checkpoint refers to this dataset",
    )


@dataclass(frozen=True)
class RetrySpec:
    max_preemptions: int = spec_field(
        "Spot preemptions (node lost or spot notice) to recover from before the run fails.", default=50, minimum=0
    )
    max_failures: int = spec_field(
        "Failures of the job itself (non-zero exit, crash) to retry before the run fails.", default=3, minimum=0
    )
    backoff_seconds: int = spec_field(
        "Seconds to wait before the next attempt after a failure (not after a preemption).", default=30, minimum=0
    )
    max_wait_seconds: int | None = spec_field(
        "The longest an attempt waits for capacity (its pods unschedulable: no node with room, a node pool "
        "scaling up, no spot node), in all, before the run fails with CapacityWaitExceeded; the wait spends no "
        "budget. Unset: no bound, the run waits until capacity comes.",
        default=None,
        minimum=1,
    )


@dataclass(frozen=True)
class QueueSpec:
    """A Kueue queue that admits the run's attempts (docs/deploy.md, "Queues")."""

    name: str | None = spec_field(
        "The LocalQueue of the run's namespace that admits each attempt: its RayJob carries "
        "kueue.x-k8s.io/queue-name and is made suspended, and Kueue starts it when the ClusterQueue has "
        "quota. The run says queued meanwhile and spends no budget; an attempt Kueue evicts for a "
        "higher-priority workload counts as a preemption and the next resumes from its checkpoint. Kueue "
        "admits no job on an existing Ray cluster: with the chart's rayClusterPerRun each attempt of a queued "
        "run gets a cluster of its own, and with rayCluster.enabled a queue is refused.",
        default=None,
        kind=LABEL_VALUE,
    )
    priority_class: str | None = spec_field(
        "A Kueue WorkloadPriorityClass for the attempts (kueue.x-k8s.io/priority-class).",
        default=None,
        kind=LABEL_VALUE,
    )


@dataclass(frozen=True)
class RunSpec:
    """What to train and how: the entrypoint, the Ray worker and head pods, where checkpoints go,
    and how often a preempted or failed run is started again."""

    entrypoint: str = spec_field(
        "The command that starts training on the Ray head, "
        "e.g. `python -m spotray.jobs.gpt2 --max-steps 200`. "
        "It runs once per attempt and must resume from the latest checkpoint (spotray's launcher does).",
        kind=TEXT,
        max_length=32768,
        when_missing="write the command to run, e.g. `python -m spotray.jobs.gpt2`",
    )
    checkpoint: CheckpointSpec = spec_field(
        "Where checkpoints go and how often. Every attempt resumes from the latest complete "
        "checkpoint there, so a preempted run loses at most everySteps steps.",
        when_missing="add `checkpoint: {uri: s3://BUCKET/PREFIX}`",
    )
    workers: WorkerSpec = spec_field(
        "The Ray worker group: replicas pods, each running one training worker per GPU (one on CPU when gpu is 0).",
        default=WorkerSpec,
    )
    head: HeadSpec = spec_field(
        "The Ray head pod, which runs the entrypoint and the Ray Train controller; it always runs on on-demand nodes.",
        default=HeadSpec,
    )
    data: DataSpec = spec_field(
        "The training data, read by the job (e.g. a MosaicML streaming dataset).", default=DataSpec
    )
    retry: RetrySpec = spec_field("How often a run is started again before it is marked Failed.", default=RetrySpec)
    queue: QueueSpec = spec_field("A Kueue queue that admits the run's attempts; unset: none.", default=QueueSpec)
    image: str | None = spec_field(
        "Container image for the head and worker pods. Unset: the image the spotray chart configures.",
        default=None,
        kind=TEXT,
        max_length=1024,
    )
    runtime_env: dict[str, Any] = spec_field(
        "A Ray runtime_env (env_vars, pip, working_dir, ...) passed to the job unchanged. It is in plain "
        "text in the RayJob, the submitter's arguments and Ray's dashboard: give secrets in secretEnv.",
        default={},
    )
    secret_env: dict[str, str] = spec_field(
        "Environment variables of the job that Secrets of the run's namespace supply: a map from the "
        "variable's name to SECRET/KEY, e.g. {HF_TOKEN: hf-token/token}. The kubelet reads the Secret when it "
        "starts the Ray head and worker pods (which fail to start while it or its key is missing); the value "
        "is never in the TrainingRun, the RayJob, the job's runtime env or Ray's dashboard. Names that "
        "spotray, KubeRay or Ray set are refused (SPOTRAY_*, RAY_*, AWS_*, KUBERAY_*, ...). Local mode "
        "(spotray run --local) takes each from its own environment variable of the same name.",
        default={},
        kind=ENV_FROM_SECRETS,
        max_items=32,
    )
    suspend: bool = spec_field(
        "true stops the current attempt after a checkpoint and starts none; false resumes the run.", default=False
    )


@dataclass(frozen=True)
class SweepOwner:
    """The TrainingSweep a run is a trial of: the sweep's name and UID (its controller owner reference)."""

    name: str
    uid: str


@dataclass(frozen=True)
class TrainingRun:
    name: str
    spec: RunSpec
    namespace: str = "default"
    sweep: SweepOwner | None = None  # a trial's sweep; None for a run of its own

    @property
    def checkpoint_key_secret(self) -> str:
        """The Secret holding the run's checkpoint key: the one its spec names, else the namespace's."""
        return self.spec.checkpoint.key_secret or DEFAULT_CHECKPOINT_KEY_SECRET


def sweep_owner(metadata: dict[str, Any]) -> SweepOwner | None:
    """The sweep of a trial: its label names a TrainingSweep that is its controller owner."""
    sweep = (metadata.get("labels") or {}).get(SWEEP_LABEL)
    for reference in metadata.get("ownerReferences") or []:
        if (
            isinstance(reference, dict)
            and reference.get("controller")
            and reference.get("kind") == SWEEP_KIND
            and reference.get("apiVersion") == API_VERSION
            and reference.get("name") == sweep
            and reference.get("uid")
        ):
            return SweepOwner(str(sweep), str(reference["uid"]))
    return None


# How long an attempt's Ray cluster may take to start (the chart's controller.startDeadlineSeconds,
# SPOTRAY_START_DEADLINE_SECONDS): the controller's default, and the job's where it was given none.
DEFAULT_START_DEADLINE_SECONDS = 900


@dataclass(frozen=True)
class RunContext:
    """What a job needs to know about the run it belongs to: set by whoever starts the attempt.

    ``run_id`` and ``attempt`` are the attempt's identity (spotray/contract/attempts.py): the
    TrainingRun's UID under the controller, the work directory's run id in local mode. It travels
    in ``SPOTRAY_RUN`` as JSON, the spec in its manifest form, and is read back through
    ``parse_spec``: the job checks what it was given as ``kubectl apply`` would.
    """

    name: str
    run_id: str
    attempt: int
    spec: RunSpec
    # The attempt runs on a Ray cluster that outlives it (a run's cluster kept across its attempts, or
    # the chart's long-lived one): its driver's SIGTERM stops the job and drains no node, which the
    # next attempt or other runs still need (train/launch/launcher.py ``install_driver_sigterm``).
    ray_cluster_outlives_attempt: bool = False
    # How long the attempt's cluster may take to start, the controller's start deadline: it bounds the
    # wait for the worker group inside a running job too (train/launch/launcher.py
    # ``worker_group_start_tries``). None: DEFAULT_START_DEADLINE_SECONDS; 0: no deadline.
    start_deadline_seconds: float | None = None

    @property
    def attempt_id(self) -> AttemptId:
        return AttemptId(self.run_id, self.attempt)

    def to_env(self) -> dict[str, str]:
        fields: dict[str, Any] = {
            "name": self.name,
            "runId": self.run_id,
            "attempt": self.attempt,
            "spec": encode_spec(self.spec),
        }
        if self.ray_cluster_outlives_attempt:  # absent otherwise: the same variable as before for most runs
            fields["rayClusterOutlivesAttempt"] = True
        if self.start_deadline_seconds is not None:
            fields["startDeadlineSeconds"] = self.start_deadline_seconds
        return {RUN_ENV_VAR: json.dumps(fields)}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RunContext | None:
        """The context from ``SPOTRAY_RUN``; None when the job was started by hand."""
        raw = (environ if environ is not None else os.environ).get(RUN_ENV_VAR)
        if not raw:
            return None
        data = json.loads(raw)
        deadline = data.get("startDeadlineSeconds")
        return cls(
            name=str(data["name"]),
            run_id=check_run_id(str(data["runId"])),
            attempt=int(data["attempt"]),
            spec=parse_spec(data["spec"], where=RUN_ENV_VAR),
            ray_cluster_outlives_attempt=data.get("rayClusterOutlivesAttempt") is True,
            start_deadline_seconds=float(deadline) if isinstance(deadline, int | float) and deadline >= 0 else None,
        )


# ------------------------------------------------------------------------------------ the codec


def field_type(python_type: Any) -> Any:
    """``X | None`` -> ``X``: the type an optional field holds when set (absent from the manifest, never null)."""
    if isinstance(python_type, types.UnionType) and type(None) in typing.get_args(python_type):
        return next(arg for arg in typing.get_args(python_type) if arg is not type(None))
    return python_type


def _is_section(python_type: Any) -> bool:
    return isinstance(python_type, type) and dataclasses.is_dataclass(python_type)


_NAME_CHECKS = {NAME: dns_subdomain_problem, RESOURCE_NAME: qualified_name_problem, LABEL_VALUE: label_value_problem}


class _Reader:
    """Reads one section's declared fields out of a mapping, collecting every problem with its path."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(self, cls: type[Any], data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.problems.append(f"{path}: must be a mapping, got {type(data).__name__}")
            data = {}
        declared = dataclasses.fields(cls)
        hints = typing.get_type_hints(cls)
        known = {camel(f.name) for f in declared}
        for key in sorted(set(data) - known, key=str):
            self.problems.append(unknown_field(f"{path}.{key}", key, known))
        values: dict[str, Any] = {}
        for spec_f in declared:
            key, info = camel(spec_f.name), spec_f.metadata["spec"]
            field_path = f"{path}.{key}"
            python_type = field_type(hints[spec_f.name])
            required = spec_f.default is dataclasses.MISSING and spec_f.default_factory is dataclasses.MISSING
            if key not in data:
                if required:
                    self.problems.append(f"{field_path}: missing; {info.when_missing}")
                    # A stand-in so the rest can be checked; its own fields are not reported missing.
                    values[spec_f.name] = (
                        _Reader().section(python_type, {}, field_path) if _is_section(python_type) else ""
                    )
                elif _is_section(python_type):
                    values[spec_f.name] = self.section(python_type, {}, field_path)
                continue  # otherwise the dataclass default
            values[spec_f.name] = self.value(python_type, info, data[key], field_path, spec_f)
        section = cls(**values)
        self.problems.extend(section.problems(path) if hasattr(section, "problems") else [])
        return section

    def value(  # noqa: PLR0911 - one reader per kind of value
        self, python_type: Any, info: SpecField, value: Any, path: str, spec_f: dataclasses.Field[Any]
    ) -> Any:
        fallback = spec_f.default if spec_f.default is not dataclasses.MISSING else None
        if _is_section(python_type):
            return self.section(python_type, value, path)
        if typing.get_origin(python_type) is dict:
            if info.kind == ENV_FROM_SECRETS:
                return self.secret_env(value, info, path)
            if info.kind in (NODE_LABELS, POD_LABELS, ANNOTATIONS):
                return self.string_map(value, info, path)
            return self.mapping(value, path)
        if typing.get_origin(python_type) is tuple:
            return self.tolerations(value, info, path)
        if python_type is bool:
            return self.boolean(value, path, fallback)
        if info.kind == STEPS_OR_AUTO:
            return self.steps_or_auto(value, info, path, fallback)
        if python_type is int:
            return self.integer(value, info, path, fallback)
        return self.string(value, info, path, fallback)

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{path}: must be a mapping, got {value!r}")
            return {}
        return value

    def secret_env(self, value: Any, info: SpecField, path: str) -> dict[str, str]:
        mapping = self.mapping(value, path)
        if info.max_items is not None and len(mapping) > info.max_items:
            self.problems.append(
                f"{path}: at most {info.max_items} variables, got {len(mapping)}; put several values in one "
                "Secret key (e.g. a JSON document) that the job splits"
            )
        for name, ref in mapping.items():
            musts = []
            if not isinstance(name, str) or len(name) > MAX_ENV_NAME_LENGTH or not ENV_NAME_PATTERN.match(name):
                musts.append(f"the variable's name must {ENV_NAME_RULE}")
            elif reserved_env_name(name):
                musts.append(f"the variable's name must {RESERVED_ENV_RULE}")
            if not (isinstance(ref, str) and SECRET_REF_PATTERN.match(ref) and SECRET_REF_LENGTH_PATTERN.match(ref)):
                musts.append(f"the value must {SECRET_REF_RULE}; got {ref!r}")
            if musts:
                self.problems.append(f"{path}.{name}: {'; and '.join(musts)}")
        return mapping

    def string_map(self, value: Any, info: SpecField, path: str) -> dict[str, str]:
        mapping = self.mapping(value, path)
        if info.max_items is not None and len(mapping) > info.max_items:
            self.problems.append(f"{path}: at most {info.max_items} entries, got {len(mapping)}")
        labels = info.kind in (NODE_LABELS, POD_LABELS)
        self.problems.extend(string_map_problems(mapping, path, label_values=labels, reserved=info.kind == POD_LABELS))
        return mapping

    def tolerations(self, value: Any, info: SpecField, path: str) -> tuple[dict[str, Any], ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problems.append(f"{path}: must be a list of tolerations, got {value!r}")
            return ()
        if info.max_items is not None and len(value) > info.max_items:
            self.problems.append(f"{path}: at most {info.max_items} entries, got {len(value)}")
        for index, item in enumerate(value):
            self.problems.extend(toleration_problems(item, f"{path}[{index}]"))
        return tuple(value)

    def boolean(self, value: Any, path: str, fallback: Any) -> Any:
        if not isinstance(value, bool):
            self.problems.append(f"{path}: must be true or false, got {value!r}")
            return fallback
        return value

    def steps_or_auto(self, value: Any, info: SpecField, path: str, fallback: Any) -> Any:
        if isinstance(value, str) and value != AUTO:
            self.problems.append(f'{path}: must be a number of steps or "{AUTO}", got {value!r}')
            return fallback
        return value if value == AUTO else self.integer(value, info, path, fallback)

    def integer(self, value: Any, info: SpecField, path: str, fallback: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{path}: must be an integer, got {value!r}")
            return fallback
        if info.minimum is not None and value < info.minimum:
            self.problems.append(f"{path}: must be >= {info.minimum}, got {value}")
        return value

    def string(self, value: Any, info: SpecField, path: str, fallback: Any) -> Any:
        if value is None:
            return fallback
        if isinstance(value, int | float) and not isinstance(value, bool) and info.kind in (CPU, MEMORY):
            value = str(value)  # `cpu: 2` in YAML is a number; Kubernetes accepts a quantity as one too
        if not isinstance(value, str) or not value.strip():
            self.problems.append(f"{path}: must be a non-empty string, got {value!r}")
            return fallback if fallback is not None else ""
        if info.choices is not None and value not in info.choices:
            self.problems.append(f"{path}: must be one of {', '.join(info.choices)}, got {value!r}")
            return fallback
        self.check_kind(value, info, path)
        return value

    def check_kind(self, value: str, info: SpecField, path: str) -> None:
        if info.kind == URI:
            try:
                parse_uri(value)
            except SpotrayError as error:
                self.problems.append(f"{path}: {error.problem}")
        elif info.kind == CPU:
            try:
                if parse_cpu(value) <= 0:
                    self.problems.append(f"{path}: must be more than 0, got {value!r}")
            except ValueError as error:
                self.problems.append(f"{path}: {error}")
        elif info.kind in _NAME_CHECKS:
            problem = _NAME_CHECKS[info.kind](value)
            if problem is not None:
                self.problems.append(f"{path}: {problem}")
        elif info.kind == MEMORY and not MEMORY_PATTERN.match(value):
            self.problems.append(f'{path}: {value!r} is not a memory quantity (write e.g. "4Gi" or "512Mi")')


def parse_spec(spec: Any, where: str = "TrainingRun") -> RunSpec:
    """A ``RunSpec`` from a TrainingRun's ``spec`` mapping; raises ``InvalidSpecError`` listing every problem."""
    if not isinstance(spec, dict):
        raise InvalidSpecError([f"spec: must be a mapping, got {type(spec).__name__}"], where)
    reader = _Reader()
    run_spec: RunSpec = reader.section(RunSpec, spec, "spec")
    if reader.problems:
        raise InvalidSpecError(reader.problems, where)
    return run_spec


def encode_spec(section: Any) -> dict[str, Any]:
    """The manifest form of a spec (or one of its sections): camelCase keys, unset fields (None, an empty
    mapping or list, a section left at its defaults) left out, so a job whose spotray predates a field
    reads a spec that does not use it.

    ``parse_spec(encode_spec(spec)) == spec`` for every spec ``parse_spec`` returns.
    """
    encoded: dict[str, Any] = {}
    for spec_f in dataclasses.fields(section):
        value = getattr(section, spec_f.name)
        if value is None or value in ({}, ()) or _default_section(value):
            continue
        if isinstance(value, tuple):
            value = list(value)
        encoded[camel(spec_f.name)] = encode_spec(value) if dataclasses.is_dataclass(value) else value
    return encoded


def _default_section(value: Any) -> bool:
    """A section whose every field has a default and holds it (parse_spec fills it in again)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return False
    try:
        return bool(value == type(value)())
    except TypeError:  # a section with a required field
        return False


def name_problem(name: object) -> str | None:
    """What is wrong with a TrainingRun's ``metadata.name``, saying the limit and why; None when nothing is."""
    if not isinstance(name, str):
        return f"metadata.name: must {NAME_LENGTH_RULE}; and must {NAME_PATTERN_RULE}; got {name!r}"
    musts = []
    if len(name) > MAX_NAME_LENGTH:
        musts.append(NAME_LENGTH_RULE)
    if not NAME_PATTERN.match(name):
        musts.append(NAME_PATTERN_RULE)
    if not musts:
        return None
    return f"metadata.name: must {'; and must '.join(musts)}; got {name!r} ({len(name)} characters)"


def parse_training_run(document: Any, where: str = "TrainingRun") -> TrainingRun:
    """A ``TrainingRun`` from a whole manifest (apiVersion, kind, metadata, spec)."""
    if not isinstance(document, dict):
        raise InvalidSpecError([f"the document must be a mapping, got {type(document).__name__}"], where)
    problems: list[str] = []
    if document.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION}, got {document.get('apiVersion')!r}")
    if document.get("kind") != KIND:
        problems.append(f"kind: must be {KIND}, got {document.get('kind')!r}")
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if (problem := name_problem(name)) is not None:
        problems.append(problem)
    namespace = metadata.get("namespace", "default") if isinstance(metadata, dict) else "default"
    try:
        spec = parse_spec(document.get("spec"), where)
    except InvalidSpecError as error:
        problems.extend(error.problems)
    if problems:
        raise InvalidSpecError(problems, where)
    sweep = sweep_owner(metadata) if isinstance(metadata, dict) else None
    return TrainingRun(name=str(name), spec=spec, namespace=str(namespace), sweep=sweep)


def read_manifest(path: Path) -> Any:
    """A manifest file's document, unchecked (``kind`` says what to parse it as)."""
    try:
        with path.open() as stream:  # read from the file, so that a YAML error names it
            return yaml.safe_load(stream)
    except FileNotFoundError:
        raise SpotrayError(f"{path} does not exist", "pass the path of a TrainingRun manifest") from None
    except IsADirectoryError:
        raise SpotrayError(f"{path} is a directory", "pass the path of a TrainingRun manifest") from None
    except UnicodeDecodeError as error:
        raise SpotrayError(f"{path} is not text ({error.reason})", "pass the path of a YAML manifest") from None
    except yaml.YAMLError as error:
        raise SpotrayError(f"{path} is not valid YAML: {error}", "fix the YAML syntax at the place shown") from None


def load_training_run(path: Path) -> TrainingRun:
    """Read and validate a TrainingRun manifest file."""
    return parse_training_run(read_manifest(path), where=str(path))
