"""Every Kubernetes name spotray's API is made of, defined once.

The TrainingRun's group, version, kind and plural; the KubeRay RayJob it creates per attempt, how
that RayJob is named and labelled and the statuses KubeRay reports on it; the node label and taint
that mark spot capacity; the label that opts a Secret in for S3; the phases a run's status can
show. The CRD (controller/crd.py), the controller, the CLI and the spec parser all import them
from here.
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
RAY_API_VERSION = f"{RAY_GROUP}/{RAY_VERSION}"
RAYJOB_KIND = "RayJob"
RAYJOB_PLURAL = "rayjobs"
RAYCLUSTER_KIND = "RayCluster"
RAYCLUSTER_PLURAL = "rayclusters"
# KubeRay's labels on a Ray cluster's pods: which cluster, and head or worker.
RAY_CLUSTER_LABEL = f"{RAY_GROUP}/cluster"
RAY_NODE_TYPE_LABEL = f"{RAY_GROUP}/node-type"
# What KubeRay reports on a RayJob: status.jobStatus, Ray's state of the job, ...
JOB_PENDING, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_STOPPED = (
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "STOPPED",
)
JOB_ENDED = (JOB_SUCCEEDED, JOB_FAILED, JOB_STOPPED)
# ... and status.jobDeploymentStatus, KubeRay's: one of these once it is done with the job.
DEPLOYMENT_COMPLETE, DEPLOYMENT_FAILED = "Complete", "Failed"
DEPLOYMENT_ENDED = (DEPLOYMENT_COMPLETE, DEPLOYMENT_FAILED)
# KubeRay's verdict on a RayJob whose spec it refuses (a name too long, an inconsistent spec): it never runs.
DEPLOYMENT_VALIDATION_FAILED = "ValidationFailed"
# A suspended RayJob (spec.suspend: created so for a queue, or suspended by Kueue to evict it): KubeRay
# deletes its cluster, Suspending, then Suspended, and starts it anew once it is unsuspended.
DEPLOYMENT_SUSPENDED = ("Suspending", "Suspended")
# Kueue's labels on a job (kueue.x-k8s.io/v1beta1): the LocalQueue that admits it, its WorkloadPriorityClass.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# On every RayJob and pod of an attempt: which run and attempt they belong to.
RUN_LABEL = f"{GROUP}/run"
ATTEMPT_LABEL = f"{GROUP}/attempt"
# Written on a RayJob by the pod watcher when a pod of its attempt was disrupted (node lost, evicted).
DISRUPTION_ANNOTATION = f"{GROUP}/disruption"
# ... and when (the pod's DisruptionTarget condition's lastTransitionTime): a loss long before the
# job ended did not end it (an elastic run goes on without the node).
DISRUPTED_AT_ANNOTATION = f"{GROUP}/disrupted-at"
# Written on a run's RayCluster (one kept across attempts: controller ``ray_cluster_per_run``) by the
# pod watcher when its head pod was disrupted: the cluster is not used again, the next attempt gets
# the next generation.
HEAD_LOST_ANNOTATION = f"{GROUP}/head-lost"
# Written on a run's RayCluster by the controller when it moved an idle spare worker pod off a node it
# shared with a training worker (controller/spare_placement.py): the pod, the node, when, tries in a row.
SPARE_MOVED_ANNOTATION = f"{GROUP}/spare-moved"
# Written on a run's RayCluster when the controller makes it: a hash of its spec as the run's spec made
# it (controller/rayjob.py ``ray_cluster_shape``). A kept cluster whose shape is not what the spec makes
# now (the image, resources, replicas or secretEnv edited) is replaced at the next attempt.
CLUSTER_SHAPE_ANNOTATION = f"{GROUP}/shape"

# Nodes: this label says which capacity a node is (Ray heads go on on-demand nodes, workers of a
# spot run on spot ones), and spot nodes carry a NoSchedule taint with this key that only spot
# workers tolerate. The controller's defaults (controller/config.py) and the test bed's nodes use
# them; the chart's values.yaml and kind-config.yaml repeat them (tests/unit/test_deploy_files.py checks).
SPOT_LABEL = f"{GROUP}/capacity"
SPOT_LABEL_SPOT = "spot"
SPOT_LABEL_ON_DEMAND = "on-demand"
SPOT_TAINT_KEY = f"{GROUP}/spot"
# A Secret labelled with this, set to "true", may be named by runs for S3 (controller/s3_access.py).
S3_OPT_IN_LABEL = f"{GROUP}/s3-credentials"

# The Secret that holds the checkpoint key of a namespace's runs (controller/checkpoint_key_secret.py makes it
# for the first run that needs it, owned by nothing, so it outlives every run), unless a run's
# spec.checkpoint.keySecret names another. Its data key holds the key (spotray/contract/checkpoint_key.py),
# which the run's Ray containers get as SPOTRAY_CHECKPOINT_KEY. `spotray pull` names it when it cannot
# check a signature.
DEFAULT_CHECKPOINT_KEY_SECRET = "spotray-checkpoint-key"  # noqa: S105 - a name, not a secret
CHECKPOINT_KEY_SECRET_DATA_KEY = "key"  # noqa: S105 - a name, not a secret


SWEEP_KIND = "TrainingSweep"
SWEEP_LABEL = f"{GROUP}/sweep"  # on each trial: the sweep it belongs to


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


# KubeRay (v1.6.1, ray-operator/controllers/ray/utils/validation.go ValidateRayJobMetadata) refuses a
# RayJob whose name is over 47 characters or not a DNS-1035 label (a lowercase letter first), and
# marks it ValidationFailed instead of running it. 47 = constant.go MaxRayJobNameLength: the RayJob's
# RayCluster is named <rayjob>-<5 random> (util.go GenerateRayClusterName), at most 53 characters
# (MaxRayClusterNameLength), so that its Services (<cluster>-head-svc, -serve-svc, -headless) fit 63.
MAX_RAYJOB_NAME_LENGTH = 47
# Every run name the spec allows (spotray/contract/spec.py MAX_NAME_LENGTH) leaves room in its RayJob
# names for attempt numbers of up to 3 digits. The budgets in spec.retry allow maxPreemptions +
# maxFailures + 1 attempts (54 by default) and each suspension adds one; a longest-named run that
# gets past this many would make a RayJob KubeRay refuses, and the controller fails it instead
# (spotray/decisions/vocabulary.py REASON_RAYJOB_NAME_TOO_LONG). A shorter name has room for more digits.
MAX_RESERVED_ATTEMPT = 999


def ray_cluster_name(run_name: str, generation: int) -> str:
    """A run's RayCluster, when one is kept across its attempts: ``<run>-c<G>``, a new generation G
    only when the last one's head was lost. KubeRay takes up to 53 characters (its Services' names
    add up to 10 to it): every run name the spec allows leaves room for 9 digits."""
    return f"{run_name}-c{generation}"


def ray_cluster_generation(name: str, run_name: str) -> int:
    """G of ``<run>-c<G>``; 0 for a name that is not one of the run's clusters."""
    generation = name.removeprefix(f"{run_name}-c")
    return int(generation) if name.startswith(f"{run_name}-c") and generation.isdigit() else 0


def rayjob_name(run_name: str, attempt: int) -> str:
    """The RayJob of attempt N of a run: ``<run>-a<N>``, at most ``MAX_RAYJOB_NAME_LENGTH`` characters
    for every attempt up to ``MAX_RESERVED_ATTEMPT`` of a name the spec allows."""
    return f"{run_name}-a{attempt}"


# How long past the drain deadline a driver that got SIGTERM waits for ``fit()`` to end before it ends
# the attempt itself (train/launch/driver_notice.py); the controller gives a suspended attempt as long
# (controller/reconcile.py), and the head's Ray job supervisor waits longer before it kills a stopped
# driver (controller/rayjob.py).
DRIVER_EXIT_MARGIN_S = 60
