"""TrainingRun + attempt number -> the KubeRay RayJob for that attempt, as a plain dict (pure).

One RayJob per attempt, named ``<run>-a<N>``: the name is the idempotency key (a second create
of the same attempt is refused by the API server, never duplicated). What goes in:

- the run's entrypoint, and a runtime env whose ``SPOTRAY_RUN`` carries the run name, attempt and
  spec to the job (spotray/contract/spec.py RunContext); the user's ``runtimeEnv`` is kept and merged;
- a head on on-demand nodes with ``num-cpus: 0`` (it hosts the driver, never training workers), and
  a worker group on spot nodes (node selector + toleration), one pod per replica, GPUs as limits;
- S3 credentials by reference only (``envFrom`` the Secret), never copied into the RayJob;
- the run's checkpoint key the same way (``checkpoint_key_env``, controller/checkpoint_key_secret.py);
- ``spec.secretEnv`` as ``env`` items with ``valueFrom.secretKeyRef`` on the head (the driver) and the
  workers (training): the kubelet reads the Secret when it starts the container, so no value passes
  through the controller (which never reads these Secrets), the RayJob, the runtime env, the
  submitter's arguments or Ray's dashboard. The chart's long-lived RayCluster started its pods
  without them: a run with ``secretEnv`` is refused there (``secret_env_refusal``);
- Ray's token auth when configured (``ray_token_auth``): ``authOptions`` mode token, so that the
  dashboard, the job API and the GCS refuse whoever does not hold the cluster's token;
- a preStop hook on workers that drains their Ray node as a preemption, so Ray Train's workers
  take an emergency checkpoint within the grace period, and one on the head that drains every node
  (a notice on the head's node ends the cluster; train/launch/drain.py);
- a readiness probe on the Ray containers, asked from their start (``readiness_probe``): KubeRay's
  first asks 10 s in, and the RayJob waits for every pod to be Ready;
- the shared volume (NFS or any PVC) when configured, with ``fsGroup`` so it is writable;
- Pod Security "restricted" on every pod (head, workers, and the submitter of K8sJobMode, which
  KubeRay would otherwise make without a securityContext): non-root uid 1000, no privilege
  escalation, no capabilities, the runtime's default seccomp profile. KubeRay copies the Ray
  container's securityContext into the init container it injects into workers;
- no Kubernetes API token in any pod (``automountServiceAccountToken: false``): the job's code
  needs none, and the namespace's default ServiceAccount is not the user's to borrow;
- no shell that the user did not ask for: the entrypoint is run by Ray's job manager through one
  shell, by design; the K8sJobMode submitter gets a command of ours (argv, no shell) instead of
  KubeRay's ``bash -c`` line, and the Ray containers get no command, only ``rayStartParams``;
- ``shutdownAfterJobFinishes`` + TTL so a finished attempt's cluster goes away, and
  ``backoffLimit: 0``: retries are the controller's (it tells preemptions from failures).

With ``ray_cluster_per_run`` the cluster is not the RayJob's: ``build_ray_cluster`` makes the run's
RayCluster ``<run>-c<G>`` (the same head and workers, labelled with the run but no attempt, owned by
the TrainingRun), kept across attempts, and each attempt's RayJob names it in ``clusterSelector``.
KubeRay then ignores the TTL and shutdown, and deleting the RayJob stops its Ray job and leaves the
cluster; the controller deletes the cluster itself (spotray/decisions/run_plan.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import yaml

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV
from spotray.contract.names import (
    API_VERSION,
    ATTEMPT_LABEL,
    CHECKPOINT_KEY_SECRET_DATA_KEY,
    CLUSTER_SHAPE_ANNOTATION,
    DRIVER_EXIT_MARGIN_S,
    KIND,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    RAY_API_VERSION,
    RAY_CLUSTER_LABEL,
    RAYCLUSTER_KIND,
    RAYJOB_KIND,
    RUN_LABEL,
    rayjob_name,
)
from spotray.contract.spec import PodPlacement, RunContext, TrainingRun, split_secret_ref
from spotray.controller.config import ControllerConfig, ray_release
from spotray.decisions.vocabulary import RayJobRefusal

MANAGED_BY = {"app.kubernetes.io/managed-by": "spotray"}
WORKER_GROUP = "workers"
SHARED_VOLUME = "shared"
SHM_VOLUME = "dshm"
KUBERAY_NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay labels each pod "head" or "worker"
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"  # one node: the kubelet sets it on every Node
# The uid of spotray's image and of the official Ray images; set explicitly because the kubelet
# cannot check runAsNonRoot against an image whose USER is a name ("ray").
RUN_AS_USER = 1000
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_USER,
    "runAsGroup": RUN_AS_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# What KubeRay gives its default submitter.
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
# The submitter's command (train/launch/submitter.py), in the run's image like the preStop hook's.
SUBMITTER_MODULE = "spotray.train.launch.submitter"
# Ray's health endpoint on each node's dashboard agent (raylet, and the GCS on the head): what
# KubeRay's own probe asks for Ray 2.53 and newer. Older Rays keep KubeRay's probe.
RAY_HEALTH_PATH = "/api/healthz"
RAY_DASHBOARD_AGENT_PORT = 52365  # Ray's default; the Ray pods here do not move it
UNIFIED_HEALTH_MIN_RAY_VERSION = (2, 53, 0)
# How long KubeRay lets a Ready Ray pod fail its probe before it is not Ready (10 tries x 5 s).
RAY_UNREADY_AFTER_S = 50
# How much longer than the driver's own bound after a stop (grace + DRIVER_EXIT_MARGIN_S) Ray's job
# supervisor waits before it kills the driver: the driver ends the attempt first, with its record.
JOB_STOP_SLACK_S = 30


def owner_reference(run_name: str, run_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": run_name,
        "uid": run_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _argv_literal(text: str) -> str:
    """``text`` as an element of a container's command that the kubelet passes on unchanged.

    The kubelet replaces ``$(NAME)`` in command and args with the container's variable NAME (KubeRay
    defines some on the submitter) and ``$$`` with ``$``; ``$$`` for every ``$`` undoes both.
    """
    return text.replace("$", "$$")


def _runtime_env(
    run: TrainingRun, attempt: int, run_uid: str, cluster_outlives_attempt: bool, config: ControllerConfig
) -> dict[str, Any]:
    user = dict(run.spec.runtime_env)
    env_vars = {str(k): str(v) for k, v in (user.pop("env_vars", None) or {}).items()}
    # The attempt's identity: the run's UID and the number (spotray/contract/attempts.py); the start
    # deadline, which bounds the job's wait for its worker group as well as the RayJob's start.
    context = RunContext(
        run.name,
        run_uid,
        attempt,
        run.spec,
        ray_cluster_outlives_attempt=cluster_outlives_attempt,
        start_deadline_seconds=float(config.start_deadline_seconds),
    )
    env_vars.update(context.to_env())
    return {**user, "env_vars": env_vars}


def _s3_env(run: TrainingRun, config: ControllerConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, envFrom) for S3 access: the Secret by reference, the endpoint as plain config."""
    env: list[dict[str, Any]] = []
    if config.s3_endpoint:
        # MosaicML streaming reads S3_ENDPOINT_URL; boto3 and our store read AWS_ENDPOINT_URL.
        env += [
            {"name": "AWS_ENDPOINT_URL", "value": config.s3_endpoint},
            {"name": "S3_ENDPOINT_URL", "value": config.s3_endpoint},
        ]
    secret = run.spec.checkpoint.secret_ref or config.s3_secret
    env_from = [{"secretRef": {"name": secret}}] if secret else []
    return env, env_from


def _secret_env(run: TrainingRun) -> list[dict[str, Any]]:
    """``spec.secretEnv`` as references that the kubelet resolves, in name order."""
    env = []
    for name, ref in sorted(run.spec.secret_env.items()):
        secret, key = split_secret_ref(ref)
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def checkpoint_key_env(run: TrainingRun) -> dict[str, Any]:
    """The env item that gives a Ray container the run's checkpoint key (controller/checkpoint_key_secret.py),
    if its Secret exists: a run without one goes on neither signing nor checking. A sweep's trials
    share their sweep's, so that one can resume from another's checkpoint (population-based training)."""
    ref = {"name": run.checkpoint_key_secret, "key": CHECKPOINT_KEY_SECRET_DATA_KEY, "optional": True}
    return {"name": CHECKPOINT_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}


def _pod_template(
    run: TrainingRun,
    attempt: int | None,
    config: ControllerConfig,
    placement: PodPlacement,
    *,
    container: dict[str, Any],
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
    grace_seconds: int | None = None,
    spread: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Ray group's pod: the chart's placement for the group (``node_selector``, ``tolerations``)
    with the run's own (``placement``: spec.head or spec.workers) over it."""
    spec: dict[str, Any] = {
        "containers": [container],
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "automountServiceAccountToken": False,
    }
    selector = {**node_selector, **placement.node_selector}
    if selector:
        spec["nodeSelector"] = selector
    tolerated = [dict(t) for t in (*tolerations, *placement.tolerations)]
    if tolerated:
        spec["tolerations"] = tolerated
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    affinity = _affinity(placement.affinity, spread)
    if affinity:
        spec["affinity"] = affinity
    service_account = placement.service_account_name or config.ray_service_account
    if service_account:
        spec["serviceAccountName"] = service_account
    priority_class = placement.priority_class_name or config.ray_priority_class
    if priority_class:
        spec["priorityClassName"] = priority_class
    volumes, mounts = [], []
    if config.shared_pvc:
        spec["securityContext"]["fsGroup"] = config.fs_group
        volumes.append({"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": config.shared_pvc}})
        mounts.append({"name": SHARED_VOLUME, "mountPath": config.shared_mount_path})
    shm_size = placement.shm_size or config.ray_shm_size
    if shm_size:
        # A memory-backed emptyDir over /dev/shm: the container runtime's own is 64 MB.
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})  # noqa: S108 - the pod's own shm, not a temp file
    if volumes:
        spec["volumes"] = volumes
        container["volumeMounts"] = mounts
    metadata: dict[str, Any] = {"labels": {**placement.labels, **_labels(run, attempt)}}
    if placement.annotations:
        metadata["annotations"] = dict(placement.annotations)
    return {"metadata": metadata, "spec": spec}


def _affinity(declared: dict[str, Any], spread: dict[str, Any] | None) -> dict[str, Any]:
    """The run's affinity with the workers' spread (a preferred anti-affinity term) added to it."""
    affinity = copy.deepcopy(declared)
    if spread is not None:
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(spread)
    return affinity


def _spread_workers(run: TrainingRun) -> dict[str, Any] | None:
    """A run with spares asks the scheduler to put its worker pods on different nodes (preferred, so
    a pool with fewer nodes still starts the run): a spare on the node of the worker it stands in
    for goes with it when a reclaim takes that node. Without spares the scheduler packs as it likes."""
    if not run.spec.workers.spare_replicas:
        return None
    selector = {RUN_LABEL: run.name, KUBERAY_NODE_TYPE_LABEL: "worker"}
    term = {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_TOPOLOGY_KEY}
    return {"weight": 100, "podAffinityTerm": term}


def readiness_probe(config: ControllerConfig, *, head: bool) -> dict[str, Any] | None:
    """The Ray container's readiness probe; None leaves KubeRay's.

    A RayJob is submitted only once every pod of its cluster is Ready. KubeRay's probe (v1.6) first
    asks 10 s after the container starts and then every 5 s, so a head whose Ray was up in 4 s is
    Ready at 10 s, and a worker whose container started at 7 s at 17 s (docs/goodput.md, a fresh
    start on real pods). This one asks the same endpoint from the container's start, every
    ``ray_readiness_period_seconds``, and takes a Ready pod out as late as KubeRay's would.
    """
    period = config.ray_readiness_period_seconds
    release = ray_release(config.ray_version)
    if period <= 0 or release is None or release < UNIFIED_HEALTH_MIN_RAY_VERSION:
        return None
    return {
        "httpGet": {"path": RAY_HEALTH_PATH, "port": RAY_DASHBOARD_AGENT_PORT},
        "periodSeconds": period,
        # KubeRay's timeouts: the head's answer includes the GCS's.
        "timeoutSeconds": 5 if head else 2,
        "successThreshold": 1,
        "failureThreshold": max(1, -(-RAY_UNREADY_AFTER_S // period)),
    }


def _labels(run: TrainingRun, attempt: int | None) -> dict[str, str]:
    """The run's, and the attempt's where the object is one attempt's (not a cluster kept across them)."""
    attempt_label = {ATTEMPT_LABEL: str(attempt)} if attempt is not None else {}
    return {RUN_LABEL: run.name, **attempt_label, **MANAGED_BY}


def _container(name: str, image: str, *, cpu: str, memory: str, env: list[Any], env_from: list[Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    if env:
        container["env"] = copy.deepcopy(env)
    if env_from:
        container["envFrom"] = copy.deepcopy(env_from)
    return container


def _cluster_spec(
    run: TrainingRun, attempt: int | None, config: ControllerConfig, capacity: str | None = None
) -> dict[str, Any]:
    image = run.spec.image or config.default_image
    env, env_from = _s3_env(run, config)
    env += _secret_env(run)
    if config.run_checkpoint_keys:
        env.append(checkpoint_key_env(run))
    head = _container("ray-head", image, cpu=run.spec.head.cpu, memory=run.spec.head.memory, env=env, env_from=env_from)
    workers = run.spec.workers
    worker = _container("ray-worker", image, cpu=workers.cpu, memory=workers.memory, env=env, env_from=env_from)
    if workers.gpu:
        worker["resources"]["limits"][workers.gpu_resource or config.gpu_resource] = workers.gpu
    for container, is_head in ((head, True), (worker, False)):
        probe = readiness_probe(config, head=is_head)
        if probe is not None:
            container["readinessProbe"] = probe
    # A spot notice reaches the pod as SIGTERM after preStop: drain first so Ray Train checkpoints. The
    # head's notice ends the whole cluster: its hook drains every node (train/launch/drain.py).
    grace = config.worker_grace_seconds
    drain = ["python", "-m", "spotray.train.launch.drain", "--deadline-seconds", str(grace)]
    worker["lifecycle"] = {"preStop": {"exec": {"command": drain}}}
    head["lifecycle"] = {"preStop": {"exec": {"command": [*drain, "--whole-cluster"]}}}
    # A RayJob deleted (a suspend, a run deleted) has its Ray job stopped: the supervisor on the head
    # sends the driver SIGTERM, which drains every node for an emergency checkpoint, and SIGKILLs it
    # after RAY_JOB_STOP_WAIT_TIME_S, 3 s by Ray's default. The workers die with their driver, so the
    # checkpoint did too (a suspended run resumed from step 0): the driver's own bound comes first.
    stop_wait_s = grace + DRIVER_EXIT_MARGIN_S + JOB_STOP_SLACK_S
    head.setdefault("env", []).append({"name": "RAY_JOB_STOP_WAIT_TIME_S", "value": str(stop_wait_s)})
    on_spot = workers.on_spot(capacity)
    worker_selector = config.spot_node_selector if on_spot else config.head_node_selector
    worker_tolerations = config.spot_tolerations if on_spot else config.head_tolerations
    spec: dict[str, Any] = {
        "rayVersion": config.ray_version,
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},
            "template": _pod_template(
                run,
                attempt,
                config,
                run.spec.head,
                container=head,
                node_selector=config.head_node_selector,
                tolerations=config.head_tolerations,
                grace_seconds=grace,
            ),
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                # The run's replicas and its spares (idle until a notice takes a worker's node). Ray
                # Train's group (train/launch/launcher.py) decides how many of them it uses; KubeRay
                # keeps asking for all of them, so lost spot pods come back with capacity.
                "replicas": workers.pods,
                "minReplicas": workers.min_replicas or workers.replicas,
                "maxReplicas": workers.pods,
                "rayStartParams": {},
                "template": _pod_template(
                    run,
                    attempt,
                    config,
                    workers,
                    container=worker,
                    node_selector=worker_selector,
                    tolerations=worker_tolerations,
                    grace_seconds=grace,
                    spread=_spread_workers(run),
                ),
            }
        ],
    }
    if config.ray_token_auth:
        # KubeRay makes a Secret with a random token for this cluster (owned by it, so deleted with
        # it) and sets RAY_AUTH_MODE and RAY_AUTH_TOKEN on the Ray containers, the wait-gcs-ready init
        # container and the submitter; its own dashboard client reads the Secret. The controller
        # never sees the token, and every cluster (an attempt's, or a run's generation) has another one.
        spec["authOptions"] = {"mode": "token"}
    return spec


def _submitter_template(run: TrainingRun, attempt: int, image: str, runtime_env: dict[str, Any]) -> dict[str, Any]:
    """The K8sJobMode submitter pod: KubeRay's default one, made restricted, with a command of ours.

    Left without a command, KubeRay runs ``bash -c`` on one line with the entrypoint pasted in and
    the runtime env (the whole spec, in SPOTRAY_RUN) in double quotes, where ``$(...)`` and
    backticks run in this pod and the entrypoint is split and expanded before Ray's own shell sees
    it. Ours hands both to the job API as argv elements (train/launch/submitter.py); KubeRay still
    sets RAY_DASHBOARD_ADDRESS and RAY_JOB_SUBMISSION_ID, which it reads. KubeRay's line would also
    pass the RayJob's metadata and entrypoint resources: this RayJob sets neither.

    It gets no S3 Secret: it only submits the job to the head's dashboard. It carries the run's
    labels, which the chart's NetworkPolicy admits to the run's Ray ports.
    """
    runtime_env_json = json.dumps(runtime_env, sort_keys=True, separators=(",", ":"))
    container = {
        "name": "ray-job-submitter",
        "image": image,
        "command": [
            "python",
            "-m",
            SUBMITTER_MODULE,
            f"--runtime-env-json={_argv_literal(runtime_env_json)}",
            "--",
            _argv_literal(run.spec.entrypoint),
        ],
        "resources": copy.deepcopy(SUBMITTER_RESOURCES),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    return {
        "metadata": {"labels": _labels(run, attempt)},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
            "automountServiceAccountToken": False,
            "containers": [container],
        },
    }


def build_ray_cluster(
    run: TrainingRun, name: str, run_uid: str, config: ControllerConfig, capacity: str | None = None
) -> dict[str, Any]:
    """The run's RayCluster ``name`` (``<run>-c<G>``), kept across its attempts, owned by the TrainingRun,
    annotated with its shape (``ray_cluster_shape``); its workers on ``capacity``'s nodes."""
    spec = _cluster_spec(run, None, config, capacity)
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": RAYCLUSTER_KIND,
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": _labels(run, None),
            "annotations": {CLUSTER_SHAPE_ANNOTATION: _shape(spec)},
            "ownerReferences": [owner_reference(run.name, run_uid)],
        },
        "spec": spec,
    }


def ray_cluster_shape(run: TrainingRun, config: ControllerConfig, capacity: str | None = None) -> str:
    """A hash of the RayCluster spec the run's spec makes now, its workers on ``capacity``'s nodes: the
    image, resources, replicas, secretEnv, placement, everything. A kept cluster annotated with another was
    made from an older spec, or for the other capacity (spotray/decisions/ray_cluster.py ``next_ray_cluster``
    replaces it)."""
    return _shape(_cluster_spec(run, None, config, capacity))


def _shape(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def build_rayjob(
    run: TrainingRun,
    attempt: int,
    run_uid: str,
    config: ControllerConfig,
    ray_cluster: str | None = None,
    *,
    capacity: str | None = None,
) -> dict[str, Any]:
    """The RayJob for ``attempt`` of ``run``, owned by the TrainingRun (deleting the run deletes it).

    ``ray_cluster``: the run's RayCluster that the attempt runs on (``build_ray_cluster``); None: a
    cluster of the RayJob's own, or the chart's long-lived one (``config.ray_cluster_selector``).
    ``capacity``: spot or on-demand, where the attempt's workers run (None: the run's policy's first).
    """
    # A cluster that is not the RayJob's own outlives the attempt: stopping the job must leave it usable.
    outlives = ray_cluster is not None or bool(config.ray_cluster_selector)
    runtime_env = _runtime_env(run, attempt, run_uid, outlives, config)
    spec: dict[str, Any] = {
        "entrypoint": run.spec.entrypoint,
        "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
        "submissionMode": config.submission_mode,
        "backoffLimit": 0,
    }
    if config.submission_mode == "K8sJobMode":
        image = run.spec.image or config.default_image
        spec["submitterPodTemplate"] = _submitter_template(run, attempt, image, runtime_env)
    if ray_cluster is not None:
        # The run's own, kept across attempts: the controller creates and deletes it.
        spec["clusterSelector"] = {RAY_CLUSTER_LABEL: ray_cluster}
    elif config.ray_cluster_selector:
        # A long-lived RayCluster (the chart's optional one): nothing to create or shut down.
        spec["clusterSelector"] = dict(config.ray_cluster_selector)
    else:
        spec["shutdownAfterJobFinishes"] = True
        spec["ttlSecondsAfterFinished"] = config.rayjob_ttl_seconds
        spec["rayClusterSpec"] = _cluster_spec(run, attempt, config, capacity)
    if run.spec.queue.name is not None:
        # Made suspended: Kueue unsuspends it once its ClusterQueue admits it (queue_refusal: with a
        # cluster of its own only), and suspends it again to evict it.
        spec["suspend"] = True
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": RAYJOB_KIND,
        "metadata": {
            "name": rayjob_name(run.name, attempt),
            "namespace": run.namespace,
            "labels": {**_labels(run, attempt), **_queue_labels(run)},
            "ownerReferences": [owner_reference(run.name, run_uid)],
        },
        "spec": spec,
    }


def _queue_labels(run: TrainingRun) -> dict[str, str]:
    """Kueue's labels on the RayJob: the LocalQueue that admits it, and its WorkloadPriorityClass."""
    queue = run.spec.queue
    labels = {KUEUE_QUEUE_LABEL: queue.name} if queue.name else {}
    if queue.name and queue.priority_class:
        labels[KUEUE_PRIORITY_LABEL] = queue.priority_class
    return labels


def secret_env_refusal(run: TrainingRun, config: ControllerConfig) -> RayJobRefusal | None:
    """A refusal when the run names ``spec.secretEnv`` but its jobs go to the chart's long-lived RayCluster,
    whose pods were started without them: the job would run without its variables."""
    if not (run.spec.secret_env and config.ray_cluster_selector):
        return None
    return RayJobRefusal(
        code=None,
        reason="SecretEnvNeedsOwnCluster",
        message=(
            f"spec.secretEnv ({', '.join(sorted(run.spec.secret_env))}) reaches only the pods of a Ray cluster of "
            "the run's own, and this controller sends every job to the chart's long-lived RayCluster "
            f"({json.dumps(config.ray_cluster_selector, sort_keys=True)}), whose pods started without them: remove "
            "spec.secretEnv, or run the controller without rayCluster.enabled"
        ),
    )


def keeps_ray_cluster(run: TrainingRun, config: ControllerConfig) -> bool:
    """Whether the run's attempts share one RayCluster kept across them (``ray_cluster_per_run``).

    Not for a run that names a Kueue queue: Kueue admits a RayJob only with a cluster of its own, whose
    pods it counts, so each of its attempts gets its RayJob's own cluster.
    """
    return config.ray_cluster_per_run and run.spec.queue.name is None


def queue_refusal(run: TrainingRun, config: ControllerConfig) -> RayJobRefusal | None:
    """A refusal when the run names a Kueue queue but its jobs would run on the chart's long-lived Ray
    cluster (rayCluster.enabled): Kueue admits a RayJob only with a cluster of its own, whose pods it
    can count. (With a cluster kept per run, a queued run's attempts get their own: ``keeps_ray_cluster``.)"""
    if run.spec.queue.name is None or not config.ray_cluster_selector:
        return None
    return RayJobRefusal(
        code=None,
        reason="QueueNeedsOwnCluster",
        message=(
            f"spec.queue.name ({run.spec.queue.name}): Kueue admits a RayJob only with a Ray cluster of its own, "
            "and this controller runs jobs on an existing one (rayCluster.enabled): remove spec.queue, or run "
            "the controller without rayCluster.enabled"
        ),
    )


# etcd refuses a write over 1.5 MiB (its default --max-request-bytes), and KubeRay copies the RayJob's
# cluster spec into a RayCluster: a RayJob over 1 MiB is refused before the API server is asked, with
# its size. spec.runtimeEnv is the usual cause: it is in the RayJob twice (runtimeEnvYAML, and
# SPOTRAY_RUN inside it), and twice more in K8sJobMode (the submitter's command).
MAX_RAYJOB_BYTES = 1024 * 1024


# Linux refuses to start a process with one argument of 128 KiB or more (MAX_ARG_STRLEN): the
# K8sJobMode submitter takes the runtime env as one argument, so its pod would never start.
MAX_ARGUMENT_BYTES = 128 * 1024 - 1


def size_refusal(made: dict[str, Any], limit: int = MAX_RAYJOB_BYTES) -> RayJobRefusal | None:
    """A refusal naming the size of ``made`` (a RayJob, or the run's RayCluster) when it is over ``limit``
    bytes as JSON, or one argument of a RayJob's submitter's command when Linux would not start it;
    None when it fits."""
    spec = made.get("spec", {})
    submitter = (spec.get("submitterPodTemplate") or {}).get("spec", {}).get("containers") or [{}]
    longest = max((len(str(arg).encode()) for arg in submitter[0].get("command") or []), default=0)
    if longest > MAX_ARGUMENT_BYTES:
        return RayJobRefusal(
            code=None,
            reason="TooLarge",
            message=(
                f"the submitter pod's command would have an argument of {longest} bytes (the runtime env), and "
                f"Linux starts no process with one over {MAX_ARGUMENT_BYTES}: put large files in the image or "
                "the bucket, not in spec.runtimeEnv"
            ),
        )
    size = len(json.dumps(made, separators=(",", ":")).encode())
    if size <= limit:
        return None
    kind = made.get("kind", RAYJOB_KIND)
    if kind == RAYJOB_KIND:
        runtime_env = len(str(spec.get("runtimeEnvYAML", "")).encode())
        why = f"{runtime_env} bytes of it are the runtime env, spec.runtimeEnv counted twice"
        if "submitterPodTemplate" in spec:
            why += "; the submitter's command holds the runtime env once more"
        fix = "put large files in the image or the bucket, not in spec.runtimeEnv"
    else:  # the run's RayCluster: its head and worker pod templates
        why = "its head and worker pod templates"
        fix = "they come from spec.head, spec.workers, spec.secretEnv and the chart's Ray pod settings"
    return RayJobRefusal(
        code=None,
        reason="TooLarge",
        message=(
            f"the {kind} would be {size} bytes, over the {limit} the API server's store can take with KubeRay's "
            f"copies of it ({why}): {fix}"
        ),
    )
