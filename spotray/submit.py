"""``spotray submit FILE``: validate a TrainingRun here, then create or update it in the cluster.

Validation runs first and locally (``load_training_run``), so a bad manifest is refused with
every problem listed before anything reaches the cluster. The object is then applied server-side
(as ``kubectl apply --server-side`` would), so submitting the same file again updates the run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from spotray.cluster_options import KubeOptions
from spotray.contract.attempts import EXIT_OK
from spotray.contract.errors import SpotrayError
from spotray.contract.names import GROUP
from spotray.contract.spec import load_training_run
from spotray.output import emit
from spotray.watch import watch_run


def manifest_namespace(document: dict[str, Any]) -> str | None:
    metadata = document.get("metadata") or {}
    namespace = metadata.get("namespace")
    return str(namespace) if namespace else None


def next_steps(name: str, namespace: str) -> str:
    flags = f"{name} -n {namespace}"
    steps = [
        (f"spotray watch {flags}", "live progress; survives preemptions"),
        (f"spotray status {flags}", "phase, attempts, last checkpoint"),
        (f"spotray logs {flags}", "the current attempt's job logs"),
        (f"spotray pull {flags} ./{name}-final", "the newest complete checkpoint"),
    ]
    width = max(len(command) for command, _ in steps)
    return "\n".join(["next:", *(f"  {command.ljust(width)}   # {why}" for command, why in steps)])


def submit_command(path: Path, kube: KubeOptions, *, watch: bool) -> int:
    training_run = load_training_run(path)  # refuses a bad manifest here, listing every problem
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    namespace = manifest_namespace(document)
    if namespace and kube.namespace and namespace != kube.namespace:
        raise SpotrayError(
            f"{path} says metadata.namespace {namespace}, but --namespace says {kube.namespace}",
            "leave out one of them, or make them agree",
        )
    from spotray.kube import ClusterConnection  # noqa: PLC0415 - the kubernetes client loads only once the manifest is valid

    cluster = ClusterConnection(replace(kube, namespace=namespace or kube.namespace))
    _, verb = cluster.apply_run(document, cluster.namespace)
    where = f"namespace {cluster.namespace}, context {cluster.context_name}"
    emit(f"trainingrun.{GROUP}/{training_run.name} {verb} ({where})")
    if watch:
        return watch_run(cluster, training_run.name)
    emit(next_steps(training_run.name, cluster.namespace))
    return EXIT_OK
