"""The TrainingRun spec as typed data: one model for the controller, the launcher and local mode.

A TrainingRun manifest (``kind: TrainingRun``, group ``spotray.dev``) is parsed here into frozen
dataclasses with defaults filled in. Every problem is reported at once, each with the field path
and what to write instead, so a user fixes a manifest in one pass. The launcher inside Ray reads the
same model back from the ``SPOTRAY_RUN`` environment variable, which the controller and
``spotray run --local`` set: that variable is the whole contract between them and the job.

This module imports only the standard library and PyYAML, so the controller can use it without
pulling in torch or Ray.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotray.contract.attempts import AttemptId, check_run_id
from spotray.contract.errors import SpotrayError
from spotray.contract.names import API_VERSION, KIND
from spotray.contract.uris import parse_uri

RUN_ENV_VAR = "SPOTRAY_RUN"
# The CRD (controller/crd.py) reuses these, so the API server and this parser agree.
# Kubernetes object names (RFC 1123 subdomain, shortened): they become Ray run names and S3 keys too.
NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 50  # room for "-a<attempt>" and KubeRay's own suffixes within 63
CPU_PATTERN = re.compile(r"^(\d+(\.\d+)?)(m?)$")
MEMORY_PATTERN = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")


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


def parse_cpu(text: str) -> float:
    """A Kubernetes CPU quantity ("2", "0.5", "500m") as a number of cores."""
    match = CPU_PATTERN.match(text.strip())
    if not match:
        raise ValueError(f'{text!r} is not a CPU quantity (write e.g. "2", "0.5" or "500m")')
    value = float(match.group(1))
    return value / 1000 if match.group(3) else value


@dataclass(frozen=True)
class WorkerSpec:
    """The Ray worker group: ``replicas`` pods, each running one training worker per GPU (or one on CPU).

    With ``min_replicas`` below ``replicas`` the run is elastic: it goes on with as few as
    ``min_replicas`` pods when spot nodes are lost, and grows back as they return.
    """

    replicas: int = 2
    cpu: str = "1"
    memory: str = "4Gi"
    gpu: int = 0
    spot: bool = True
    min_replicas: int | None = None  # None: replicas (a fixed size)

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
    def worker_counts(self) -> range:
        """Every number of training workers the run may have: each must split the global batch."""
        return range(self.min_workers, self.num_workers + 1, self.workers_per_replica)

    @property
    def cpu_per_worker(self) -> float:
        return parse_cpu(self.cpu) / self.workers_per_replica


@dataclass(frozen=True)
class HeadSpec:
    cpu: str = "1"
    memory: str = "4Gi"


AUTO = "auto"


@dataclass(frozen=True)
class CheckpointSpec:
    uri: str
    every_steps: int | str = 100  # or AUTO: chosen while training (train/hf/checkpoint_interval.py)
    min_every_steps: int = 10
    max_every_steps: int = 5000
    keep: int = 3
    secret_ref: str | None = None

    @property
    def auto_interval(self) -> bool:
        return self.every_steps == AUTO

    @property
    def fixed_every_steps(self) -> int | None:
        """The fixed interval; None with everySteps: auto."""
        return None if isinstance(self.every_steps, str) else self.every_steps


@dataclass(frozen=True)
class DataSpec:
    uri: str | None = None


@dataclass(frozen=True)
class RetrySpec:
    max_preemptions: int = 50
    max_failures: int = 3
    backoff_seconds: int = 30


@dataclass(frozen=True)
class RunSpec:
    entrypoint: str
    checkpoint: CheckpointSpec
    workers: WorkerSpec = field(default_factory=WorkerSpec)
    head: HeadSpec = field(default_factory=HeadSpec)
    data: DataSpec = field(default_factory=DataSpec)
    retry: RetrySpec = field(default_factory=RetrySpec)
    image: str | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
    suspend: bool = False


@dataclass(frozen=True)
class TrainingRun:
    name: str
    spec: RunSpec
    namespace: str = "default"


@dataclass(frozen=True)
class RunContext:
    """What a job needs to know about the run it belongs to: set by whoever starts the attempt.

    ``run_id`` and ``attempt`` are the attempt's identity (spotray/contract/attempts.py): the TrainingRun's UID
    under the controller, the work directory's run id in local mode.
    """

    name: str
    run_id: str
    attempt: int
    spec: RunSpec

    @property
    def attempt_id(self) -> AttemptId:
        return AttemptId(self.run_id, self.attempt)

    def to_env(self) -> dict[str, str]:
        fields = {"name": self.name, "run_id": self.run_id, "attempt": self.attempt, "spec": asdict(self.spec)}
        return {RUN_ENV_VAR: json.dumps(fields)}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RunContext | None:
        """The context from ``SPOTRAY_RUN``; None when the job was started by hand."""
        raw = (environ if environ is not None else os.environ).get(RUN_ENV_VAR)
        if not raw:
            return None
        data = json.loads(raw)
        spec = data["spec"]
        return cls(
            name=data["name"],
            run_id=check_run_id(str(data["run_id"])),
            attempt=int(data["attempt"]),
            spec=RunSpec(
                entrypoint=spec["entrypoint"],
                checkpoint=CheckpointSpec(**spec["checkpoint"]),
                workers=WorkerSpec(**spec["workers"]),
                head=HeadSpec(**spec["head"]),
                data=DataSpec(**spec["data"]),
                retry=RetrySpec(**spec["retry"]),
                image=spec["image"],
                runtime_env=spec["runtime_env"],
                suspend=spec["suspend"],
            ),
        )


# ------------------------------------------------------------------------------------------ parsing


class _Reader:
    """Reads typed fields out of nested dicts, collecting every problem with its path."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(self, data: dict[str, Any], key: str, path: str) -> dict[str, Any]:
        value = data.get(key, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{path}.{key}: must be a mapping, got {type(value).__name__}")
            return {}
        return value

    def unknown(self, data: dict[str, Any], known: set[str], path: str) -> None:
        for key in sorted(set(data) - known):
            self.problems.append(f"{path}.{key}: unknown field (known: {', '.join(sorted(known))})")

    def integer(self, data: dict[str, Any], key: str, path: str, default: int, minimum: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{path}.{key}: must be an integer, got {value!r}")
            return default
        if value < minimum:
            self.problems.append(f"{path}.{key}: must be >= {minimum}, got {value}")
        return value

    def string(self, data: dict[str, Any], key: str, path: str, default: str | None) -> str | None:
        value = data.get(key, default)
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # `cpu: 2` in YAML is a number; Kubernetes accepts it too
        if not isinstance(value, str) or not value.strip():
            self.problems.append(f"{path}.{key}: must be a non-empty string, got {value!r}")
            return default
        return value

    def boolean(self, data: dict[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.problems.append(f"{path}.{key}: must be true or false, got {value!r}")
            return default
        return value

    def uri(self, value: str | None, path: str, *, s3_only: bool = False) -> None:
        if value is None:
            return
        try:
            parsed = parse_uri(value)
        except SpotrayError as error:
            self.problems.append(f"{path}: {error.problem}")
            return
        if s3_only and parsed.scheme != "s3":
            self.problems.append(f"{path}: must be an s3:// URI, got {value!r}")


def _read_workers(reader: _Reader, spec: dict[str, Any]) -> WorkerSpec:
    path = "spec.workers"
    data = reader.section(spec, "workers", "spec")
    reader.unknown(data, {"replicas", "minReplicas", "cpu", "memory", "gpu", "spot"}, path)
    defaults = WorkerSpec()
    replicas = reader.integer(data, "replicas", path, defaults.replicas, 1)
    min_replicas = reader.integer(data, "minReplicas", path, replicas, 1) if "minReplicas" in data else None
    if min_replicas is not None and min_replicas > replicas:
        reader.problems.append(
            f"{path}.minReplicas: must be <= replicas ({replicas}), got {min_replicas}; "
            "replicas is the most pods the run uses, minReplicas the fewest it goes on with"
        )
    workers = WorkerSpec(
        replicas=replicas,
        cpu=reader.string(data, "cpu", path, defaults.cpu) or defaults.cpu,
        memory=reader.string(data, "memory", path, defaults.memory) or defaults.memory,
        gpu=reader.integer(data, "gpu", path, defaults.gpu, 0),
        spot=reader.boolean(data, "spot", path, defaults.spot),
        min_replicas=min_replicas,
    )
    _check_resources(reader, workers.cpu, workers.memory, path)
    return workers


def _read_head(reader: _Reader, spec: dict[str, Any]) -> HeadSpec:
    path = "spec.head"
    data = reader.section(spec, "head", "spec")
    reader.unknown(data, {"cpu", "memory"}, path)
    defaults = HeadSpec()
    head = HeadSpec(
        cpu=reader.string(data, "cpu", path, defaults.cpu) or defaults.cpu,
        memory=reader.string(data, "memory", path, defaults.memory) or defaults.memory,
    )
    _check_resources(reader, head.cpu, head.memory, path)
    return head


def _check_resources(reader: _Reader, cpu: str, memory: str, path: str) -> None:
    try:
        if parse_cpu(cpu) <= 0:
            reader.problems.append(f"{path}.cpu: must be more than 0, got {cpu!r}")
    except ValueError as error:
        reader.problems.append(f"{path}.cpu: {error}")
    if not MEMORY_PATTERN.match(memory):
        reader.problems.append(f'{path}.memory: {memory!r} is not a memory quantity (write e.g. "4Gi" or "512Mi")')


def _read_checkpoint(reader: _Reader, spec: dict[str, Any]) -> CheckpointSpec:
    path = "spec.checkpoint"
    if "checkpoint" not in spec:
        reader.problems.append(f"{path}: missing; add `checkpoint: {{uri: s3://BUCKET/PREFIX}}`")
    data = reader.section(spec, "checkpoint", "spec")
    reader.unknown(data, {"uri", "everySteps", "minEverySteps", "maxEverySteps", "keep", "secretRef"}, path)
    uri = reader.string(data, "uri", path, None)
    if uri is None and "checkpoint" in spec:
        reader.problems.append(f"{path}.uri: missing; write where checkpoints go, e.g. s3://BUCKET/PREFIX")
    reader.uri(uri, f"{path}.uri")
    every = data.get("everySteps")
    every_steps: int | str = AUTO
    if isinstance(every, str) and every != AUTO:
        reader.problems.append(f'{path}.everySteps: must be a number of steps or "auto", got {every!r}')
    elif every != AUTO:
        every_steps = reader.integer(data, "everySteps", path, 100, 1)
    shortest = reader.integer(data, "minEverySteps", path, CheckpointSpec.min_every_steps, 1)
    longest = reader.integer(data, "maxEverySteps", path, CheckpointSpec.max_every_steps, 1)
    if 1 <= longest < shortest:  # (a bound below 1 is reported on its own)
        reader.problems.append(f"{path}.maxEverySteps: must be >= minEverySteps ({shortest}), got {longest}")
    return CheckpointSpec(
        uri=uri or "",
        every_steps=every_steps,
        min_every_steps=shortest,
        max_every_steps=longest,
        keep=reader.integer(data, "keep", path, 3, 1),
        secret_ref=reader.string(data, "secretRef", path, None),
    )


def _read_retry(reader: _Reader, spec: dict[str, Any]) -> RetrySpec:
    path = "spec.retry"
    data = reader.section(spec, "retry", "spec")
    reader.unknown(data, {"maxPreemptions", "maxFailures", "backoffSeconds"}, path)
    defaults = RetrySpec()
    return RetrySpec(
        max_preemptions=reader.integer(data, "maxPreemptions", path, defaults.max_preemptions, 0),
        max_failures=reader.integer(data, "maxFailures", path, defaults.max_failures, 0),
        backoff_seconds=reader.integer(data, "backoffSeconds", path, defaults.backoff_seconds, 0),
    )


_SPEC_FIELDS = {"entrypoint", "image", "runtimeEnv", "workers", "head", "checkpoint", "data", "retry", "suspend"}


def parse_spec(spec: Any, where: str = "TrainingRun") -> RunSpec:
    """A ``RunSpec`` from a TrainingRun's ``spec`` mapping; raises ``InvalidSpecError`` listing every problem."""
    if not isinstance(spec, dict):
        raise InvalidSpecError([f"spec: must be a mapping, got {type(spec).__name__}"], where)
    reader = _Reader()
    reader.unknown(spec, _SPEC_FIELDS, "spec")
    entrypoint = reader.string(spec, "entrypoint", "spec", None)
    if entrypoint is None and "entrypoint" not in spec:
        reader.problems.append("spec.entrypoint: missing; write the command to run, e.g. `python -m spotray.jobs.gpt2`")
    runtime_env = spec.get("runtimeEnv") or {}
    if not isinstance(runtime_env, dict):
        reader.problems.append(f"spec.runtimeEnv: must be a mapping (a Ray runtime_env), got {runtime_env!r}")
        runtime_env = {}
    data = reader.section(spec, "data", "spec")
    reader.unknown(data, {"uri"}, "spec.data")
    data_uri = reader.string(data, "uri", "spec.data", None)
    reader.uri(data_uri, "spec.data.uri")
    run_spec = RunSpec(
        entrypoint=entrypoint or "",
        checkpoint=_read_checkpoint(reader, spec),
        workers=_read_workers(reader, spec),
        head=_read_head(reader, spec),
        data=DataSpec(uri=data_uri),
        retry=_read_retry(reader, spec),
        image=reader.string(spec, "image", "spec", None),
        runtime_env=runtime_env,
        suspend=reader.boolean(spec, "suspend", "spec", False),
    )
    if reader.problems:
        raise InvalidSpecError(reader.problems, where)
    return run_spec


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
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > MAX_NAME_LENGTH:
        problems.append(
            f"metadata.name: must be lowercase letters, digits and '-', at most {MAX_NAME_LENGTH} characters, "
            f"got {name!r}"
        )
    namespace = metadata.get("namespace", "default") if isinstance(metadata, dict) else "default"
    try:
        spec = parse_spec(document.get("spec"), where)
    except InvalidSpecError as error:
        problems.extend(error.problems)
    if problems:
        raise InvalidSpecError(problems, where)
    return TrainingRun(name=str(name), spec=spec, namespace=str(namespace))


def load_training_run(path: Path) -> TrainingRun:
    """Read and validate a TrainingRun manifest file."""
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpotrayError(f"{path} does not exist", "pass the path of a TrainingRun manifest") from None
    except yaml.YAMLError as error:
        raise SpotrayError(f"{path} is not valid YAML: {error}", "fix the YAML syntax at the place shown") from None
    return parse_training_run(document, where=str(path))
