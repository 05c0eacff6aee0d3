"""Every Kubernetes name spotray's API is made of, defined once.

The TrainingRun's group, version, kind and plural; the KubeRay RayJob it creates per attempt and
how that RayJob is named and labelled; the phases a run's status can show. The CRD
(controller/crd.py), the controller, the CLI and the spec parser all import them from here.
Standard library only: the job images and a laptop with no Kubernetes client import it too.
"""

from __future__ import annotations

GROUP = "spotray.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingRun"
PLURAL = "trainingruns"
CRD_NAME = f"{PLURAL}.{GROUP}"

RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAYJOB_PLURAL = "rayjobs"

# On every RayJob and pod of an attempt: which run and attempt they belong to.
RUN_LABEL = f"{GROUP}/run"
ATTEMPT_LABEL = f"{GROUP}/attempt"
# Written on a RayJob by the pod watcher when a pod of its attempt was disrupted (node lost, evicted).
DISRUPTION_ANNOTATION = f"{GROUP}/disruption"
# ... and when (the pod's DisruptionTarget condition's lastTransitionTime): a loss long before the
# job ended did not end it (an elastic run goes on without the node).
DISRUPTED_AT_ANNOTATION = f"{GROUP}/disrupted-at"

# status.phase of a TrainingRun.
PENDING, RUNNING, RESUMING, SUSPENDED, SUCCEEDED, FAILED = (
    "Pending",
    "Running",
    "Resuming",
    "Suspended",
    "Succeeded",
    "Failed",
)
PHASES = (PENDING, RUNNING, RESUMING, SUSPENDED, SUCCEEDED, FAILED)
TERMINAL_PHASES = (SUCCEEDED, FAILED)


def rayjob_name(run_name: str, attempt: int) -> str:
    """The RayJob of attempt N of a run: ``<run>-a<N>`` (the run name is at most 50 characters)."""
    return f"{run_name}-a{attempt}"
