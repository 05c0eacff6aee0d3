"""``spotray submit FILE``: validate a TrainingRun (or a TrainingSweep) here, then create or update it in the cluster.

Validation runs first and locally (``load_training_run``), so a bad manifest is refused with
every problem listed before anything reaches the cluster. The object is then applied server-side
(as ``kubectl apply --server-side`` would), so submitting the same file again updates the run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from spotray.cli.cluster_options import KubeOptions
from spotray.cli.output import emit
from spotray.cli.watch import watch_run
from spotray.contract.attempts import EXIT_OK
from spotray.contract.errors import SpotrayError
from spotray.contract.names import GROUP, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.spec import load_training_run, read_manifest
from spotray.contract.sweep import parse_sweep


def manifest_namespace(document: dict[str, Any]) -> str | None:
    metadata = document.get("metadata") or {}
    namespace = metadata.get("namespace")
    return str(namespace) if namespace else None


def _listed(steps: list[tuple[str, str]]) -> str:
    width = max(len(command) for command, _ in steps)
    return "\n".join(["next:", *(f"  {command.ljust(width)}   # {why}" for command, why in steps)])


def next_steps(name: str, namespace: str) -> str:
    flags = f"{name} -n {namespace}"
    return _listed(
        [
            (f"spotray watch {flags}", "live progress; survives preemptions"),
            (f"spotray status {flags}", "phase, attempts, last checkpoint"),
            (f"spotray logs {flags}", "the current attempt's job logs"),
            (f"spotray pull {flags} ./{name}-final", "the newest complete checkpoint"),
        ]
    )


def sweep_next_steps(name: str, namespace: str) -> str:
    return _listed(
        [
            (f"kubectl get trainingsweep {name} -n {namespace}", "trials by state, the best so far"),
            (f"kubectl get trainingruns -n {namespace} -l {SWEEP_LABEL}={name}", "its trials, each a TrainingRun"),
        ]
    )


def submit_command(path: Path, kube: KubeOptions, *, watch: bool) -> int:
    document = read_manifest(path)
    is_sweep = isinstance(document, dict) and document.get("kind") == SWEEP_KIND
    if is_sweep:
        # Refuses a bad sweep here, listing every problem; its template is checked as a TrainingRun's spec.
        name = parse_sweep(document, where=str(path)).name
        if watch:
            raise SpotrayError("--watch follows one TrainingRun, and this is a sweep", "drop --watch")
    else:
        name = load_training_run(path).name  # refuses a bad manifest here, listing every problem
    namespace = manifest_namespace(document)
    if namespace and kube.namespace and namespace != kube.namespace:
        raise SpotrayError(
            f"{path} says metadata.namespace {namespace}, but --namespace says {kube.namespace}",
            "leave out one of them, or make them agree",
        )
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415 - the kubernetes client loads only once the manifest is valid

    cluster = ClusterConnection(replace(kube, namespace=namespace or kube.namespace))
    _, verb = cluster.apply_run(document, cluster.namespace)
    where = f"namespace {cluster.namespace}, context {cluster.context_name}"
    emit(f"{'trainingsweep' if is_sweep else 'trainingrun'}.{GROUP}/{name} {verb} ({where})")
    if watch:
        return watch_run(cluster, name)
    emit(sweep_next_steps(name, cluster.namespace) if is_sweep else next_steps(name, cluster.namespace))
    return EXIT_OK
