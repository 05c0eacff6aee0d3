"""The controller's settings: every one comes from an environment variable, read here and nowhere else.

The Helm chart sets these on the controller Deployment (charts/spotray/values.yaml documents each);
a developer running ``python -m spotray.controller`` against a test cluster sets the few they need.
"""

from __future__ import annotations

import ipaddress
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from spotray.contract.errors import SpotrayError
from spotray.contract.names import SPOT_LABEL, SPOT_LABEL_ON_DEMAND, SPOT_LABEL_SPOT, SPOT_TAINT_KEY
from spotray.contract.spec import DEFAULT_START_DEADLINE_SECONDS
from spotray.decisions.cost import Prices
from spotray.decisions.observation import STORAGE_PATIENCE_SECONDS

SUBMISSION_MODES = ("K8sJobMode", "HTTPMode")
# The labels of KubeRay's own Helm chart on the operator's pods (the chart's networkPolicy.kuberayPodSelector).
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}


def _json_env(environ: dict[str, str], name: str, default: Any, kind: type) -> Any:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise SpotrayError(f"{name} is not valid JSON: {error}", f"set {name} to a JSON {kind.__name__}") from None
    if not isinstance(value, kind):
        fix = f"set {name} to a JSON {kind.__name__}"
        raise SpotrayError(f"{name} must be a JSON {kind.__name__}, got {raw!r}", fix)
    return value


def _list_env(environ: dict[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list; blanks around and between items ignored."""
    return tuple(item.strip() for item in environ.get(name, "").split(",") if item.strip())


def _directories_env(environ: dict[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of absolute directories, normalized; never ``/`` (a whole file system)."""
    directories = []
    for item in _list_env(environ, name):
        path = "/" + posixpath.normpath(item).lstrip("/")  # POSIX keeps a leading "//"; one is enough
        if not item.startswith("/") or path == "/":
            raise SpotrayError(
                f"{name} must list absolute directories other than /, got {item!r}",
                f"list the shared volumes mounted into the controller in {name}, e.g. /mnt/shared",
            )
        directories.append(path)
    return tuple(directories)


def _cidrs_env(environ: dict[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of CIDRs (an address alone is its /32 or /128), as NetworkPolicy ipBlocks take them."""
    cidrs = []
    for item in _list_env(environ, name):
        try:
            cidrs.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise SpotrayError(
                f"{name} must list CIDRs, got {item!r}", f"list addresses or ranges in {name}, e.g. 192.0.2.10/32"
            ) from None
    return tuple(cidrs)


def _int_env(environ: dict[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpotrayError(f"{name} must be an integer, got {raw!r}", f"set {name} to a whole number") from None
    if value < minimum:
        raise SpotrayError(f"{name} must be >= {minimum}, got {value}", f"set {name} to {minimum} or more")
    return value


@dataclass(frozen=True)
class ControllerConfig:
    """What the controller needs beyond each TrainingRun's own spec."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace (cluster-wide)
    default_image: str = "spotray/spotray:0.1.0"
    ray_version: str = "2.60.0"
    # K8sJobMode: KubeRay runs `ray job submit` in a pod. HTTPMode: the operator itself posts the
    # job to the head's dashboard (what the Docker-free test bed uses, where pods run nothing).
    submission_mode: str = "K8sJobMode"
    head_node_selector: dict[str, str] = field(default_factory=lambda: {SPOT_LABEL: SPOT_LABEL_ON_DEMAND})
    head_tolerations: list[dict[str, Any]] = field(default_factory=list)
    spot_node_selector: dict[str, str] = field(default_factory=lambda: {SPOT_LABEL: SPOT_LABEL_SPOT})
    spot_tolerations: list[dict[str, Any]] = field(
        default_factory=lambda: [{"key": SPOT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    )
    # The chart's defaults for every run's Ray pods, under a run's own spec.head/spec.workers
    # (controller/rayjob.py): the GPU's extended resource, a ServiceAccount (a cloud identity), a
    # PriorityClass, a /dev/shm size; None: Kubernetes' own.
    gpu_resource: str = "nvidia.com/gpu"
    ray_service_account: str | None = None
    ray_priority_class: str | None = None
    ray_shm_size: str | None = None
    s3_secret: str | None = None  # default Secret with AWS_* keys when a run names none
    s3_endpoint: str | None = None  # given to pods, and used here to read checkpoints
    # Secrets runs may use without the opt-in label, and endpoints the controller may connect to
    # besides s3_endpoint (controller/s3_access.py).
    allowed_s3_secrets: tuple[str, ...] = ()
    allowed_s3_endpoints: tuple[str, ...] = ()
    # Directories inside which a run's file:// checkpoint URI is read (a shared volume mounted in the
    # controller at the same path as in the Ray pods); empty: none (controller/run_store.py).
    file_roots: tuple[str, ...] = ()
    shared_pvc: str | None = None
    shared_mount_path: str = "/mnt/shared"
    fs_group: int = 1000
    ray_cluster_selector: dict[str, str] = field(default_factory=dict)
    # One RayCluster per run, kept across its attempts (the chart's rayJob.clusterPerRun): a reclaim
    # that takes spot workers but not the on-demand head costs no new head; each attempt is a RayJob
    # with a clusterSelector on it (controller/rayjob.py build_ray_cluster). Off: a cluster per attempt.
    ray_cluster_per_run: bool = False
    # With ray_cluster_per_run: move a run's idle spare worker pod off the node it shares with a
    # training worker (controller/spare_placement.py). Off: the scheduler's first placement stays.
    move_idle_spares: bool = True
    rayjob_ttl_seconds: int = 600
    worker_grace_seconds: int = 120
    # How often the kubelet asks a Ray pod whether it is Ready (controller/rayjob.py readiness_probe);
    # 0 leaves KubeRay's own probe, which first asks 10 s after the container starts, then every 5 s.
    ray_readiness_period_seconds: int = 2
    reconcile_interval_seconds: int = 10
    # The periodic refreshes of all active runs start at most this often (controller/work_queue.py):
    # with more runs than interval x rate, each run's interval grows instead of the load.
    refreshes_per_second: int = 10
    # A failed RayJob is judged only this long after it ended, so that a pod's disruption that
    # caused it (reported on its own watch stream) is seen first.
    settle_seconds: int = 5
    start_deadline_seconds: int = DEFAULT_START_DEADLINE_SECONDS  # Observation.start_deadline_seconds
    # /healthz fails when the TrainingRun watch has not delivered a listed change for this long
    # (controller/watch_health.py); the check LISTs the runs every third of it.
    watch_grace_seconds: int = 180
    storage_patience_seconds: int = STORAGE_PATIENCE_SECONDS
    metrics_port: int = 9090
    health_port: int = 8080
    peering: str | None = None
    log_format: str = "text"
    prices: Prices | None = None  # status.cost (spotray/decisions/cost.py); None: no cost shown
    # Whether the controller may get Nodes (the chart's rbac.readNodes): how a node lost while it
    # was down is read back (controller/reconcile.py _node_loss_read_back).
    read_nodes: bool = True
    # A NetworkPolicy per run, made before its first RayJob (controller/network_policy.py): only the
    # run's own pods and ``kuberay_peer`` reach its Ray ports (the chart's networkPolicy.enabled).
    run_network_policy: bool = False
    # A checkpoint key per run, in a Secret made before its first RayJob (controller/checkpoint_key_secret.py):
    # its jobs sign their checkpoints and load only signed ones (the chart's checkpointKeys.enabled).
    run_checkpoint_keys: bool = False
    # Ray's token auth on each attempt's RayCluster (KubeRay's authOptions, mode token; the chart's
    # rayTokenAuth.enabled): KubeRay makes the token's Secret with the cluster and deletes it with it,
    # and gives it to the Ray containers and the submitter; the dashboard, job API and GCS refuse
    # callers without it.
    ray_token_auth: bool = False
    # The KubeRay operator's pods, as a NetworkPolicy peer (it polls every Ray head's dashboard).
    kuberay_peer: dict[str, Any] = field(
        default_factory=lambda: {"namespaceSelector": {}, "podSelector": {"matchLabels": KUBERAY_OPERATOR_LABELS}}
    )
    # The operator's addresses when it runs outside the pod network (host network, or off-cluster),
    # where no pod selector matches it: each an ipBlock peer beside ``kuberay_peer``.
    kuberay_ip_blocks: tuple[str, ...] = ()
    # Where a run's pods may connect besides their own run's pods and DNS, as NetworkPolicy egress
    # rules (the chart's networkPolicy.runEgress, plus MinIO's S3 port when it runs MinIO); None:
    # anywhere (the run's policy limits ingress only).
    run_egress: list[dict[str, Any]] | None = None

    @property
    def s3_endpoints_allowed(self) -> tuple[str, ...]:
        """Where the controller may send S3 requests, besides AWS S3 itself."""
        return tuple(e for e in (self.s3_endpoint, *self.allowed_s3_endpoints) if e)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ControllerConfig:
        env = dict(os.environ if environ is None else environ)
        defaults = cls()
        mode = env.get("SPOTRAY_SUBMISSION_MODE", defaults.submission_mode)
        if mode not in SUBMISSION_MODES:
            raise SpotrayError(
                f"SPOTRAY_SUBMISSION_MODE must be one of {', '.join(SUBMISSION_MODES)}, got {mode!r}",
                "use K8sJobMode on a real cluster",
            )
        log_format = env.get("SPOTRAY_LOG_FORMAT", defaults.log_format)
        if log_format not in ("text", "json"):
            raise SpotrayError(f"SPOTRAY_LOG_FORMAT must be text or json, got {log_format!r}", "use json or text")
        namespaces = _list_env(env, "SPOTRAY_NAMESPACES")
        ray_version = env.get("SPOTRAY_RAY_VERSION") or defaults.ray_version
        ray_token_auth = _bool_env(env, "SPOTRAY_RAY_TOKEN_AUTH", defaults.ray_token_auth)
        if ray_token_auth:
            _require_token_auth_version(ray_version)
        ray_cluster_selector = _json_env(env, "SPOTRAY_RAY_CLUSTER_SELECTOR", {}, dict)
        ray_cluster_per_run = _bool_env(env, "SPOTRAY_RAY_CLUSTER_PER_RUN", defaults.ray_cluster_per_run)
        if ray_cluster_selector and ray_cluster_per_run:
            raise SpotrayError(
                "SPOTRAY_RAY_CLUSTER_SELECTOR (every job on the chart's long-lived RayCluster) and "
                "SPOTRAY_RAY_CLUSTER_PER_RUN (a RayCluster of each run's own) exclude each other",
                "set one of rayCluster.enabled and controller.rayClusterPerRun in the chart's values",
            )
        return cls(
            namespaces=namespaces,
            default_image=env.get("SPOTRAY_DEFAULT_IMAGE") or defaults.default_image,
            ray_version=ray_version,
            submission_mode=mode,
            head_node_selector=_json_env(env, "SPOTRAY_HEAD_NODE_SELECTOR", defaults.head_node_selector, dict),
            head_tolerations=_json_env(env, "SPOTRAY_HEAD_TOLERATIONS", defaults.head_tolerations, list),
            spot_node_selector=_json_env(env, "SPOTRAY_SPOT_NODE_SELECTOR", defaults.spot_node_selector, dict),
            spot_tolerations=_json_env(env, "SPOTRAY_SPOT_TOLERATIONS", defaults.spot_tolerations, list),
            gpu_resource=env.get("SPOTRAY_GPU_RESOURCE") or defaults.gpu_resource,
            ray_service_account=env.get("SPOTRAY_RAY_SERVICE_ACCOUNT") or None,
            ray_priority_class=env.get("SPOTRAY_RAY_PRIORITY_CLASS") or None,
            ray_shm_size=env.get("SPOTRAY_RAY_SHM_SIZE") or None,
            s3_secret=env.get("SPOTRAY_S3_SECRET") or None,
            s3_endpoint=env.get("SPOTRAY_S3_ENDPOINT") or None,
            allowed_s3_secrets=_list_env(env, "SPOTRAY_ALLOWED_S3_SECRETS"),
            allowed_s3_endpoints=_list_env(env, "SPOTRAY_ALLOWED_S3_ENDPOINTS"),
            file_roots=_directories_env(env, "SPOTRAY_FILE_ROOTS"),
            shared_pvc=env.get("SPOTRAY_SHARED_PVC") or None,
            shared_mount_path=env.get("SPOTRAY_SHARED_MOUNT_PATH") or defaults.shared_mount_path,
            fs_group=_int_env(env, "SPOTRAY_FS_GROUP", defaults.fs_group),
            ray_cluster_selector=ray_cluster_selector,
            ray_cluster_per_run=ray_cluster_per_run,
            move_idle_spares=_bool_env(env, "SPOTRAY_MOVE_IDLE_SPARES", defaults.move_idle_spares),
            rayjob_ttl_seconds=_int_env(env, "SPOTRAY_RAYJOB_TTL_SECONDS", defaults.rayjob_ttl_seconds),
            worker_grace_seconds=_int_env(env, "SPOTRAY_WORKER_GRACE_SECONDS", defaults.worker_grace_seconds, 1),
            ray_readiness_period_seconds=_int_env(
                env, "SPOTRAY_RAY_READINESS_PERIOD_SECONDS", defaults.ray_readiness_period_seconds
            ),
            reconcile_interval_seconds=_int_env(
                env, "SPOTRAY_RECONCILE_INTERVAL_SECONDS", defaults.reconcile_interval_seconds, 1
            ),
            refreshes_per_second=_int_env(env, "SPOTRAY_REFRESHES_PER_SECOND", defaults.refreshes_per_second, 1),
            settle_seconds=_int_env(env, "SPOTRAY_SETTLE_SECONDS", defaults.settle_seconds),
            start_deadline_seconds=_int_env(env, "SPOTRAY_START_DEADLINE_SECONDS", defaults.start_deadline_seconds),
            storage_patience_seconds=_int_env(
                env, "SPOTRAY_STORAGE_PATIENCE_SECONDS", defaults.storage_patience_seconds, 1
            ),
            watch_grace_seconds=_int_env(env, "SPOTRAY_WATCH_GRACE_SECONDS", defaults.watch_grace_seconds, 3),
            metrics_port=_int_env(env, "SPOTRAY_METRICS_PORT", defaults.metrics_port),
            health_port=_int_env(env, "SPOTRAY_HEALTH_PORT", defaults.health_port),
            peering=env.get("SPOTRAY_PEERING") or None,
            log_format=log_format,
            prices=Prices.from_env(env),
            read_nodes=_bool_env(env, "SPOTRAY_READ_NODES", defaults.read_nodes),
            run_network_policy=_bool_env(env, "SPOTRAY_RUN_NETWORK_POLICY", defaults.run_network_policy),
            kuberay_peer=_json_env(env, "SPOTRAY_KUBERAY_PEER", defaults.kuberay_peer, dict),
            kuberay_ip_blocks=_cidrs_env(env, "SPOTRAY_KUBERAY_IP_BLOCKS"),
            run_egress=_json_env(env, "SPOTRAY_RUN_EGRESS", None, list),
            run_checkpoint_keys=_bool_env(env, "SPOTRAY_RUN_CHECKPOINT_KEYS", defaults.run_checkpoint_keys),
            ray_token_auth=ray_token_auth,
        )


# Ray's token auth came in 2.52.0; KubeRay refuses authOptions for an older spec.rayVersion.
TOKEN_AUTH_MIN_RAY_VERSION = (2, 52, 0)


def ray_release(ray_version: str) -> tuple[int, int, int] | None:
    """``"2.60.0"`` -> (2, 60, 0); None for what is not a release number (a nightly, a typo)."""
    release = re.match(r"(\d+)\.(\d+)\.(\d+)", ray_version.strip())
    if release is None:
        return None
    major, minor, patch = (int(number) for number in release.groups())
    return major, minor, patch


def _require_token_auth_version(ray_version: str) -> None:
    """Refuse, at start, a Ray version that KubeRay would refuse token auth for on every RayJob."""
    release = ray_release(ray_version)
    wanted = ".".join(map(str, TOKEN_AUTH_MIN_RAY_VERSION))
    if release is None:
        raise SpotrayError(
            f"SPOTRAY_RAY_VERSION must be a Ray release like 2.60.0 for token auth, got {ray_version!r}",
            "set the chart's ray.version to the Ray version of the image",
        )
    if release < TOKEN_AUTH_MIN_RAY_VERSION:
        raise SpotrayError(
            f"Ray's token auth (SPOTRAY_RAY_TOKEN_AUTH) needs Ray {wanted} or newer, not {ray_version}",
            f"use an image with Ray {wanted} or newer and set ray.version to it, or set rayTokenAuth.enabled=false",
        )


def _bool_env(env: dict[str, str], name: str, default: bool) -> bool:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text not in ("true", "false"):
        raise SpotrayError(f"{name} must be true or false, got {text!r}", f"set {name}=true or {name}=false")
    return text == "true"
