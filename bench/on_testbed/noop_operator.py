"""The baseline for bench/on_testbed/controller.py: a kopf operator that does the least a controller can.

On each TrainingRun it creates one ConfigMap, ``<run>-noop``, and nothing else: kopf's own latency
(watch, queue, thread pool) plus one API call. The spotray controller does the same kopf work plus
its real reconcile (read the run, check the Secret, write the status, create the RayJob).

    KUBECONFIG=... SPOTRAY_NAMESPACES=ns python bench/on_testbed/noop_operator.py
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
from kubernetes import client, config

API: client.CoreV1Api | None = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global API  # noqa: PLW0603 - one client per process, as in the controller
    settings.posting.level = logging.WARNING  # same settings as controller/handlers.py
    settings.execution.max_workers = 20
    settings.scanning.disabled = True  # namespaced rights only, as the controller runs with
    config.load_kube_config()  # type: ignore[no-untyped-call]
    API = client.CoreV1Api()


@kopf.on.create("spotray.dev", "v1alpha1", "trainingruns")
def create_child(meta: kopf.Meta, **_: Any) -> None:
    assert API is not None
    body = {"metadata": {"name": f"{meta.name}-noop", "labels": {"bench": "noop"}}, "data": {}}
    API.create_namespaced_config_map(str(meta.namespace), body)  # type: ignore[arg-type]


def main() -> None:
    kopf.configure(verbose=False)
    namespaces = [ns for ns in os.environ["SPOTRAY_NAMESPACES"].split(",") if ns]
    port = os.environ.get("SPOTRAY_HEALTH_PORT", "8080")
    kopf.run(namespaces=namespaces, standalone=True, liveness_endpoint=f"http://127.0.0.1:{port}/healthz")


if __name__ == "__main__":
    main()
