"""The Helm chart, rendered by the real helm binary: `helm lint`, `helm template` with each values
file under tests/data/chart/, and values.schema.json refusing typos and bad values.

helm comes from the test bed cache (testbed/build.sh builds it from the Go module proxy);
when it is missing the tests fail and say how to build it, they never skip.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import testbed.cluster as tb
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob, readiness_probe
from tests.lifecycle_runs import run as training_run
from tests.pod_security import restricted_violations

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.unit

CHART = ROOT / "charts" / "spotray"
VALUES_DIR = ROOT / "tests" / "data" / "chart"
VALUES_FILES = sorted(p.name for p in VALUES_DIR.glob("*.yaml"))
NAMESPACE = "spotray-system"
RELEASE = "sr"
FULLNAME = "sr-spotray"

# What each values file renders (kind -> count); hook Jobs included, as `helm template` prints them.
EXPECTED_KINDS = {
    "defaults.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
    },
    "monitoring.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "ServiceMonitor": 1,
        "PodMonitor": 1,
        "ConfigMap": 1,  # the Grafana dashboard
    },
    "existing-s3-secret.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
    },
    "minio.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "NetworkPolicy": 1,  # who may reach Ray and MinIO ports
        "Deployment": 1,
        "Service": 2,
        "StatefulSet": 1,
        "Job": 1,
    },
    "minio-tenants.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "NetworkPolicy": 1,
        "Deployment": 1,
        "Service": 2,
        "StatefulSet": 1,
        "Job": 2,  # MinIO's buckets, and the tenants' users
        "Secret": 3,  # a user's keys in each tenant namespace, and both for the hook
        "ConfigMap": 1,  # the hook's script
    },
    "nfs.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "PersistentVolume": 1,
        "PersistentVolumeClaim": 1,
        "Job": 1,
    },
    "storage-class.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "PersistentVolumeClaim": 1,
        "Job": 1,
    },
    # Two namespaces: a Role and a RoleBinding in each, nothing cluster-wide.
    "namespaced.yaml": {
        "ServiceAccount": 1,
        "Role": 2,
        "RoleBinding": 2,
        "Deployment": 1,
        "Service": 1,
    },
    "ha.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "ClusterKopfPeering": 1,
    },
    "ha-namespaced.yaml": {
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "KopfPeering": 1,
    },
    "raycluster.yaml": {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the controller's, and people's edit and view
        "ClusterRoleBinding": 1,
        "NetworkPolicy": 2,  # who may reach Ray and MinIO ports
        "Deployment": 1,
        "Service": 2,
        "StatefulSet": 1,
        "Job": 2,  # MinIO's buckets, and the shared volume's permissions (an existing claim too)
        "RayCluster": 1,
    },
}

# The controller's contract (controller/config.py): what it must be allowed to do.
NAMESPACED_PERMISSIONS = {
    ("spotray.dev", "trainingruns"): {"get", "list", "watch", "patch", "create"},  # create: a sweep's trials
    ("spotray.dev", "trainingruns/status"): {"patch"},
    ("spotray.dev", "trainingsweeps"): {"get", "list", "watch"},
    ("spotray.dev", "trainingsweeps/status"): {"patch"},
    ("spotray.dev", "trainingruns/finalizers"): {"update"},
    ("ray.io", "rayjobs"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "pods"): {"list", "watch"},
    ("", "secrets"): {"get", "create"},  # create: each run's checkpoint key (checkpointKeys.enabled, the default)
    ("", "events"): {"create"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get"},  # each run's (networkPolicy.enabled, the default)
}
# What a cluster-wide install adds (rbac.readNodes, on by default there): the scheduler's Events and
# the Nodes they name, read back when a node was lost while the controller was down
# (controller/reconcile.py _node_loss_read_back).
NODES, EVENTS = ("", "nodes"), ("", "events")


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def helm_binary() -> Path:
    try:
        return tb.binary("helm")
    except FileNotFoundError as error:
        pytest.fail(f"{error}. Build it with `make testbed` (helm alone: about 2 minutes cold, cached after).")


# Where the operator pushed the image built from the Dockerfile: the chart refuses to render without
# it (no image is published yet), so every render here names one, as an install must.
IMAGE = ("--set", "image.repository=spotray/spotray")


@functools.cache
def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, check=False, timeout=120)


def render(values_file: str | None = None, *sets: str) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *IMAGE]
    if values_file:
        args += ["--values", str(VALUES_DIR / values_file)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def refused(*sets: str) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *IMAGE]
    for item in sets:
        args += ["--set", item]
    result = run_helm(*args)
    assert result.returncode != 0, f"helm template accepted {sets}"
    return result.stderr


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def controller_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = only(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "controller")


def controller_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in controller_container(objects)["env"]}


def permissions(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule or rule["resourceNames"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_no_image_named_is_refused_with_the_fix(helm: Path) -> None:
    """Nothing is published: installing without image.repository would pull an image nobody built."""
    result = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert result.returncode != 0
    assert "image.repository is not set, and no spotray image is published yet" in result.stderr
    assert "docker build -t REGISTRY/spotray:" in result.stderr
    assert "--set image.repository=REGISTRY/spotray" in result.stderr


def test_the_controller_runs_its_own_small_image_when_given_one(helm: Path) -> None:
    """controller.image: the Dockerfile's controller target (no torch, no Ray). The shared volume's hook
    needs only a shell, so it runs there too; Ray pods keep the training image."""

    def images(objects: list[dict[str, Any]]) -> dict[str, str]:
        hook = only(objects, "Job")["spec"]["template"]["spec"]
        return {
            "controller": controller_container(objects)["image"],
            "hook": hook["initContainers"][0]["image"],
            "check": hook["containers"][0]["image"],
            "ray": controller_env(objects)["SPOTRAY_DEFAULT_IMAGE"],
        }

    assert set(images(render("nfs.yaml")).values()) == {"spotray/spotray:0.1.0"}, "one image unless told"
    small = images(render("nfs.yaml", "controller.image.repository=reg/spotray-controller"))
    assert small == {
        "controller": "reg/spotray-controller:0.1.0",
        "hook": "reg/spotray-controller:0.1.0",
        "check": "reg/spotray-controller:0.1.0",
        "ray": "spotray/spotray:0.1.0",
    }
    tagged = images(
        render("nfs.yaml", "image.tag=v1.2", "controller.image.repository=reg/c", "controller.image.tag=v7")
    )
    assert (tagged["controller"], tagged["ray"]) == ("reg/c:v7", "spotray/spotray:v1.2")
    assert (
        images(render("nfs.yaml", "image.tag=v1.2", "controller.image.repository=reg/c"))["controller"] == "reg/c:v1.2"
    )
    assert "additional properties 'registry' not allowed" in refused("controller.image.registry=x")


def test_every_values_file_has_expectations() -> None:
    assert set(VALUES_FILES) == set(EXPECTED_KINDS)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_helm_lint_passes(helm: Path, values_file: str) -> None:
    values = str(VALUES_DIR / values_file)
    result = run_helm("lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--values", values, *IMAGE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_objects_rendered(helm: Path, values_file: str) -> None:
    objects = render(values_file)
    kinds: dict[str, int] = {}
    for obj in objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/name"] == "spotray"
    assert kinds == EXPECTED_KINDS[values_file]


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_no_secret_is_rendered_and_nothing_is_exposed_outside_the_cluster(helm: Path, values_file: str) -> None:
    """No credential comes from values. The one exception, minio.tenants, makes new random keys."""
    objects = render(values_file)
    secrets = [o for o in objects if o["kind"] == "Secret"]
    assert all(o["metadata"]["labels"]["app.kubernetes.io/component"].startswith("minio-tenant") for o in secrets)
    for service in (o for o in objects if o["kind"] == "Service"):
        assert service["spec"]["type"] == "ClusterIP", service["metadata"]["name"]
    assert "LoadBalancer" not in json.dumps(objects)
    assert "NodePort" not in json.dumps(objects)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_selector_labels_carry_no_version(helm: Path, values_file: str) -> None:
    for obj in render(values_file):
        selector = obj.get("spec", {}).get("selector", {})
        labels = selector.get("matchLabels", selector) if obj["kind"] != "Job" else {}
        assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(labels), obj["metadata"]["name"]


def test_controller_env_with_defaults(helm: Path) -> None:
    env = controller_env(render("defaults.yaml"))
    assert env == {
        "SPOTRAY_NAMESPACES": "",
        "SPOTRAY_READ_NODES": "true",
        "SPOTRAY_DEFAULT_IMAGE": "spotray/spotray:0.1.0",
        "SPOTRAY_RAY_VERSION": "2.60.0",
        "SPOTRAY_SUBMISSION_MODE": "K8sJobMode",
        "SPOTRAY_HEAD_NODE_SELECTOR": '{"spotray.dev/capacity":"on-demand"}',
        "SPOTRAY_HEAD_TOLERATIONS": "[]",
        "SPOTRAY_SPOT_NODE_SELECTOR": '{"spotray.dev/capacity":"spot"}',
        "SPOTRAY_SPOT_TOLERATIONS": '[{"effect":"NoSchedule","key":"spotray.dev/spot","operator":"Exists"}]',
        "SPOTRAY_GPU_RESOURCE": "nvidia.com/gpu",
        "SPOTRAY_RAY_SERVICE_ACCOUNT": "",
        "SPOTRAY_RAY_PRIORITY_CLASS": "",
        "SPOTRAY_RAY_SHM_SIZE": "",
        "SPOTRAY_WORKER_GRACE_SECONDS": "120",
        "SPOTRAY_RAY_READINESS_PERIOD_SECONDS": "2",
        "SPOTRAY_FS_GROUP": "1000",
        "SPOTRAY_S3_SECRET": "",
        "SPOTRAY_S3_ENDPOINT": "",
        "SPOTRAY_ALLOWED_S3_SECRETS": "",
        "SPOTRAY_ALLOWED_S3_ENDPOINTS": "",
        "SPOTRAY_SHARED_PVC": "",
        "SPOTRAY_SHARED_MOUNT_PATH": "/mnt/shared",
        "SPOTRAY_FILE_ROOTS": "",
        "SPOTRAY_RAY_CLUSTER_SELECTOR": "",
        "SPOTRAY_RAY_CLUSTER_PER_RUN": "false",
        "SPOTRAY_MOVE_IDLE_SPARES": "true",
        "SPOTRAY_RAYJOB_TTL_SECONDS": "600",
        "SPOTRAY_RECONCILE_INTERVAL_SECONDS": "10",
        "SPOTRAY_REFRESHES_PER_SECOND": "10",
        "SPOTRAY_START_DEADLINE_SECONDS": "900",
        "SPOTRAY_STORAGE_PATIENCE_SECONDS": "600",
        "SPOTRAY_WATCH_GRACE_SECONDS": "180",
        "SPOTRAY_METRICS_PORT": "9090",
        "SPOTRAY_HEALTH_PORT": "8080",
        "SPOTRAY_PEERING": "",
        "SPOTRAY_LOG_FORMAT": "json",
        "SPOTRAY_PRICES": "{}",
        "SPOTRAY_RUN_NETWORK_POLICY": "true",
        "SPOTRAY_RUN_CHECKPOINT_KEYS": "true",
        "SPOTRAY_RAY_TOKEN_AUTH": "true",
        "SPOTRAY_KUBERAY_PEER": '{"namespaceSelector":{"matchLabels":{}},"podSelector":{"matchLabels":'
        '{"app.kubernetes.io/name":"kuberay-operator"}}}',
        "SPOTRAY_KUBERAY_IP_BLOCKS": "",
        "SPOTRAY_RUN_EGRESS": '[{"ports":[{"port":443,"protocol":"TCP"}]}]',
    }
    # Every JSON-valued setting parses as the controller expects.
    assert isinstance(json.loads(env["SPOTRAY_SPOT_TOLERATIONS"]), list)
    assert isinstance(json.loads(env["SPOTRAY_HEAD_NODE_SELECTOR"]), dict)


def test_controller_env_reads_back_through_the_controllers_config(helm: Path) -> None:
    config = ControllerConfig.from_env(controller_env(render("raycluster.yaml")))
    assert config.s3_secret == "s3-credentials"
    assert config.s3_endpoint == f"http://{FULLNAME}-minio.{NAMESPACE}.svc.cluster.local:9000"
    assert config.shared_pvc == "team-scratch"
    assert config.ray_cluster_selector == {"ray.io/cluster": f"{FULLNAME}-ray"}
    assert config.spot_tolerations == [{"key": "spotray.dev/spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert config.peering is None


def test_prices_reach_the_controller_and_half_a_price_list_is_refused(helm: Path) -> None:
    # Whole numbers: `helm --set` passes 1.1 as a string (the schema refuses it; a values file does not).
    sets = ("controller.prices.currency=EUR", "controller.prices.spotPerHour=1", "controller.prices.onDemandPerHour=3")
    prices = ControllerConfig.from_env(controller_env(render(None, *sets))).prices
    assert prices is not None
    assert (prices.currency, prices.spot_per_hour, prices.on_demand_per_hour) == ("EUR", 1.0, 3.0)
    assert "prices" in refused("controller.prices.spotPerHour=1")
    assert "prices" in refused("controller.prices.spotPerHour=-1", "controller.prices.onDemandPerHour=3")


def test_controller_pod_is_hardened_probed_and_sized(helm: Path) -> None:
    objects = render("defaults.yaml")
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    container = controller_container(objects)
    assert container["command"] == ["python", "-m", "spotray.controller"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9090, "health": 8080}
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == FULLNAME
    # Standalone kopf: a rollout must never run two controllers side by side.
    assert only(objects, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    metrics = only(objects, "Service", f"{FULLNAME}-metrics")
    assert metrics["metadata"]["annotations"]["prometheus.io/port"] == "9090"


def test_cluster_wide_rbac_grants_the_controllers_contract(helm: Path) -> None:
    objects = render("defaults.yaml")
    granted = permissions(only(objects, "ClusterRole", FULLNAME))
    for key, verbs in NAMESPACED_PERMISSIONS.items():
        assert verbs <= granted.get(key, set()), key
    # Least privilege: nothing beyond the contract (no peering without HA, no writes to pods; of
    # Secrets, only the creation of each run's checkpoint key, never an update or a delete).
    assert set(granted) == {*NAMESPACED_PERMISSIONS, NODES}  # no CRDs: kopf's scanning is off
    assert (granted[NODES], granted[EVENTS]) == ({"get"}, {"create", "list"})
    assert controller_env(objects)["SPOTRAY_READ_NODES"] == "true"
    assert granted[("", "secrets")] == {"get", "create"}
    binding = only(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_a_cluster_per_run_adds_rayclusters_by_name_and_excludes_the_long_lived_cluster(helm: Path) -> None:
    objects = render("defaults.yaml", "controller.rayClusterPerRun=true")
    granted = permissions(only(objects, "ClusterRole", FULLNAME))
    assert granted[("ray.io", "rayclusters")] == {"get", "create", "delete", "patch"}  # never list or watch
    assert controller_env(objects)["SPOTRAY_RAY_CLUSTER_PER_RUN"] == "true"
    assert ("ray.io", "rayclusters") not in permissions(only(render("defaults.yaml"), "ClusterRole", FULLNAME))
    assert "exclude each other" in refused("controller.rayClusterPerRun=true", "rayCluster.enabled=true")


def test_namespaced_rbac_uses_a_role_per_namespace_and_no_node_access(helm: Path) -> None:
    objects = render("namespaced.yaml")
    roles = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "Role"}
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        granted = permissions(role)
        assert set(granted) == set(NAMESPACED_PERMISSIONS)
        for key, verbs in NAMESPACED_PERMISSIONS.items():
            assert verbs <= granted[key], key
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    assert all(b["subjects"][0]["namespace"] == NAMESPACE for b in bindings)
    # Nothing cluster-wide: no ClusterRole, no ClusterRoleBinding.
    assert not [o for o in objects if o["kind"].startswith("Cluster")]
    assert controller_env(objects)["SPOTRAY_NAMESPACES"] == "team-a,team-b"
    assert controller_env(objects)["SPOTRAY_READ_NODES"] == "false"


def test_node_reads_are_one_cluster_wide_rule_a_namespaced_install_asks_for_and_a_cluster_wide_one_can_drop(
    helm: Path,
) -> None:
    namespaced = render("namespaced.yaml", "rbac.readNodes=true")
    (role,) = [o for o in namespaced if o["kind"] == "ClusterRole"]
    assert permissions(role) == {NODES: {"get"}}
    (binding,) = [o for o in namespaced if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == f"{FULLNAME}-nodes"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert all(permissions(o)[EVENTS] == {"create", "list"} for o in namespaced if o["kind"] == "Role")
    assert controller_env(namespaced)["SPOTRAY_READ_NODES"] == "true"
    dropped = render("defaults.yaml", "rbac.readNodes=false")
    assert NODES not in permissions(only(dropped, "ClusterRole", FULLNAME))
    assert controller_env(dropped)["SPOTRAY_READ_NODES"] == "false"


def test_ha_enables_kopf_peering(helm: Path) -> None:
    objects = render("ha.yaml")
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    peering = only(objects, "ClusterKopfPeering")
    assert controller_env(objects)["SPOTRAY_PEERING"] == peering["metadata"]["name"] == FULLNAME
    assert permissions(only(objects, "ClusterRole", FULLNAME))[("kopf.dev", "clusterkopfpeerings")] == {
        "get",
        "list",
        "watch",
        "patch",
    }

    namespaced = render("ha-namespaced.yaml")
    peering = only(namespaced, "KopfPeering")
    assert peering["metadata"] == peering["metadata"] | {"name": "spotray-peering", "namespace": "team-a"}
    assert permissions(only(namespaced, "Role"))[("kopf.dev", "kopfpeerings")] == {"get", "list", "watch", "patch"}
    assert controller_env(namespaced)["SPOTRAY_PEERING"] == "spotray-peering"


def test_kopf_peering_crds_are_shipped_in_crds_dir() -> None:
    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf-peerings.yaml").read_text()))
    assert {(d["spec"]["names"]["kind"], d["spec"]["scope"]) for d in docs} == {
        ("ClusterKopfPeering", "Cluster"),
        ("KopfPeering", "Namespaced"),
    }
    assert all(d["spec"]["group"] == "kopf.dev" for d in docs)


def test_existing_s3_secret_is_referenced_never_copied(helm: Path) -> None:
    env = controller_env(render("existing-s3-secret.yaml"))
    assert env["SPOTRAY_S3_SECRET"] == "s3-credentials"
    assert env["SPOTRAY_S3_ENDPOINT"] == "https://s3.eu-west-1.amazonaws.com"


def test_in_cluster_minio_takes_its_credentials_from_the_existing_secret(helm: Path) -> None:
    objects = render("minio.yaml")
    statefulset = only(objects, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"] if "valueFrom" in e}
    assert env == {
        "MINIO_ROOT_USER": {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"},
        "MINIO_ROOT_PASSWORD": {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    assert pod["securityContext"]["fsGroup"] == 1000
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    claim = statefulset["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "standard"
    assert claim["resources"]["requests"]["storage"] == "20Gi"
    assert (
        controller_env(objects)["SPOTRAY_S3_ENDPOINT"] == f"http://{FULLNAME}-minio.{NAMESPACE}.svc.cluster.local:9000"
    )
    job = only(objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["spotray", "datasets"]


def test_minio_tenants_get_a_user_of_their_own_in_their_namespace_and_the_hook_needs_no_api(helm: Path) -> None:
    objects = render("minio-tenants.yaml")
    secrets = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Secret"}
    assert set(secrets) == {
        ("team-a", "s3-credentials"),
        ("team-b", "s3-credentials"),
        (NAMESPACE, f"{FULLNAME}-minio-tenants"),
    }
    keys = secrets[(NAMESPACE, f"{FULLNAME}-minio-tenants")]["stringData"]
    for namespace in ("team-a", "team-b"):
        tenant = secrets[(namespace, "s3-credentials")]
        # Opted in for the controller, and the name runs use by default: TrainingRuns need no change.
        assert tenant["metadata"]["labels"]["spotray.dev/s3-credentials"] == "true"
        user = tenant["stringData"]["AWS_ACCESS_KEY_ID"]
        assert user == f"spotray-tenant-{namespace}"
        assert re.fullmatch(r"[A-Za-z0-9]{40}", tenant["stringData"]["AWS_SECRET_ACCESS_KEY"])
        assert keys[user] == tenant["stringData"]["AWS_SECRET_ACCESS_KEY"]
    assert keys["spotray-tenant-team-a"] != keys["spotray-tenant-team-b"]
    # Made here, not taken from values: another render (no cluster to read back from) makes new ones.
    run_helm.cache_clear()
    again = {o["metadata"]["namespace"]: o for o in render("minio-tenants.yaml") if o["kind"] == "Secret"}
    assert again["team-a"]["stringData"]["AWS_SECRET_ACCESS_KEY"] != keys["spotray-tenant-team-a"]

    job = only(objects, "Job", f"{FULLNAME}-minio-tenants")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"].startswith("quay.io/minio/mc:RELEASE.")
    assert container["command"] == [
        "/bin/sh",
        "/scripts/minio-tenants.sh",
        "spotray-tenant-team-a=team-a",
        "spotray-tenant-team-b=team-b-runs",
    ]
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env["MINIO_URL"] == f"http://{FULLNAME}-minio.{NAMESPACE}.svc.cluster.local:9000"
    assert env["MINIO_ROOT_PASSWORD"] == {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[env["TENANT_KEYS_DIR"]]]["secret"]["secretName"] == f"{FULLNAME}-minio-tenants"
    script = only(objects, "ConfigMap", f"{FULLNAME}-minio-tenants")["data"]["minio-tenants.sh"]
    assert script == (CHART / "files" / "minio-tenants.sh").read_text()
    assert volumes[mounts["/scripts"]]["configMap"]["name"] == f"{FULLNAME}-minio-tenants"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("minio.tenants[0].namespace=team-a", "s3.existingSecret=s3"), "minio.tenants needs minio.enabled"),
        (
            ("minio.enabled=true", "s3.existingSecret=s3", f"minio.tenants[0].namespace={NAMESPACE}"),
            "is the release's namespace",
        ),
        (
            (
                "minio.enabled=true",
                "s3.existingSecret=s3",
                "minio.tenants[0].namespace=abc",
                "minio.tenants[1].namespace=abc",
            ),
            "namespace abc is listed twice",
        ),
        (
            (
                "minio.enabled=true",
                "s3.existingSecret=s3",
                "minio.tenants[0].namespace=team-a",
                "minio.tenants[1].namespace=team-b",
                "minio.tenants[1].bucket=team-a",
            ),
            "bucket team-a is given to namespace team-b and to team-a",
        ),
        (
            ("minio.enabled=true", "s3.existingSecret=s3", "minio.tenants[0].namespace=spotray"),
            "bucket spotray of namespace spotray is one of minio.buckets",
        ),
        (("minio.enabled=true", "s3.existingSecret=s3", "minio.tenants[0].namespace=Team_A"), "does not match pattern"),
        (
            ("minio.enabled=true", "s3.existingSecret=s3", "minio.tenants[0].bucket=b"),
            "namespace is required|missing property",
        ),
        (
            ("minio.enabled=true", "s3.existingSecret=s3", "minio.tenants[0].namespace=ab"),
            "ab is not a valid bucket name",
        ),
    ],
    ids=[
        "minio-off",
        "release-namespace",
        "twice",
        "shared-bucket",
        "shared-with-root",
        "bad-namespace",
        "no-namespace",
        "short-namespace",
    ],
)
def test_bad_minio_tenants_are_refused_with_the_reason(helm: Path, sets: tuple[str, ...], message: str) -> None:
    assert re.search(message, refused(*sets)), refused(*sets)


def test_minio_without_a_secret_is_refused_with_the_fix(helm: Path) -> None:
    assert "minio.enabled needs s3.existingSecret" in refused("minio.enabled=true")


def test_nfs_volume_is_mounted_with_permissions_set_by_the_chart(helm: Path) -> None:
    objects = render("nfs.yaml")
    volume = only(objects, "PersistentVolume")
    claim = only(objects, "PersistentVolumeClaim")
    assert volume["spec"]["nfs"] == {"server": "nfs.storage.svc.cluster.local", "path": "/exports/spotray"}
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume["spec"]["claimRef"] == {"namespace": NAMESPACE, "name": claim["metadata"]["name"]}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    env = controller_env(objects)
    assert env["SPOTRAY_SHARED_PVC"] == claim["metadata"]["name"] == f"{FULLNAME}-shared"
    assert env["SPOTRAY_FS_GROUP"] == "1000"
    # NFS ignores fsGroup: a hook Job owns the volume root to the image's user, then checks a write.
    job = only(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == 1000
    set_owner = pod["initContainers"][0]
    assert "chown 1000:1000 /shared && chmod 2775 /shared" in set_owner["command"][-1]
    assert set_owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    check = pod["containers"][0]
    assert check["securityContext"]["runAsUser"] == 1000
    assert "touch /shared/" in check["command"][-1]
    assert pod["volumes"] == [{"name": "shared", "persistentVolumeClaim": {"claimName": f"{FULLNAME}-shared"}}]


def test_an_nfs_export_gets_a_claim_of_the_same_name_in_every_namespace_the_controller_serves(helm: Path) -> None:
    # A pod can mount only a claim of its own namespace, and the controller names one claim for every
    # run: without these, a run in team-a would wait for a claim that is not there.
    objects = render("nfs.yaml", "controller.watchNamespaces={team-a,team-b}")
    claims = {c["metadata"]["namespace"]: c for c in objects if c["kind"] == "PersistentVolumeClaim"}
    volumes = {v["spec"]["claimRef"]["namespace"]: v for v in objects if v["kind"] == "PersistentVolume"}
    assert set(claims) == set(volumes) == {NAMESPACE, "team-a", "team-b"}
    for namespace, claim in claims.items():
        assert claim["metadata"]["name"] == controller_env(objects)["SPOTRAY_SHARED_PVC"]
        volume = volumes[namespace]
        assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
        assert volume["spec"]["nfs"] == {"server": "nfs.storage.svc.cluster.local", "path": "/exports/spotray"}
        assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert len({v["metadata"]["name"] for v in volumes.values()}) == 3
    # One export, so one hook sets its owner: the release namespace's.
    assert only(objects, "Job")["metadata"]["namespace"] == NAMESPACE
    # A storage class would give each namespace a volume of its own, which the controller cannot read:
    # that stays the release namespace's alone, as before.
    classed = render("storage-class.yaml", "controller.watchNamespaces={team-a}")
    assert [c["metadata"]["namespace"] for c in classed if c["kind"] == "PersistentVolumeClaim"] == [NAMESPACE]


def test_file_roots_reach_the_controller_which_mounts_the_shared_volume_read_only_only_to_read_them(
    helm: Path,
) -> None:
    def controller_mounts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        pod = only(objects, "Deployment")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        return {m["mountPath"]: {**m, **volumes[m["name"]]} for m in controller_container(objects)["volumeMounts"]}

    assert set(controller_mounts(render("defaults.yaml"))) == {"/tmp"}
    assert set(controller_mounts(render("nfs.yaml"))) == {"/tmp"}, "a shared volume alone is the Ray pods'"

    objects = render("nfs.yaml", "controller.fileRoots={/mnt/shared/runs,/mnt/shared/teams}")
    config = ControllerConfig.from_env(controller_env(objects))
    assert config.file_roots == ("/mnt/shared/runs", "/mnt/shared/teams")
    shared = controller_mounts(objects)["/mnt/shared"]
    assert shared["readOnly"] is True
    assert shared["persistentVolumeClaim"] == {"claimName": f"{FULLNAME}-shared", "readOnly": True}
    # Anywhere else, or with no shared volume, a root would be the controller's own file system.
    outside = ("sharedStorage.enabled=true", "controller.fileRoots={/data}")
    for sets in [outside, ("controller.fileRoots={/mnt/shared}",)]:
        assert "the controller would read its own file system there" in refused(*sets)


def test_shared_volume_from_a_storage_class(helm: Path) -> None:
    objects = render("storage-class.yaml")
    claim = only(objects, "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "efs-sc"
    assert controller_env(objects)["SPOTRAY_SHARED_MOUNT_PATH"] == "/mnt/scratch"


def test_long_lived_ray_cluster_is_targeted_by_selector_and_keeps_its_dashboard_inside(helm: Path) -> None:
    objects = render("raycluster.yaml")
    cluster = only(objects, "RayCluster")
    name = cluster["metadata"]["name"]
    assert controller_env(objects)["SPOTRAY_RAY_CLUSTER_SELECTOR"] == json.dumps(
        {"ray.io/cluster": name}, separators=(",", ":")
    )
    spec = cluster["spec"]
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert spec["rayVersion"] == "2.60.0"
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"spotray.dev/capacity": "on-demand"}
    assert head["terminationGracePeriodSeconds"] == 120
    hook = head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == ["python", "-m", "spotray.train.launch.drain", "--deadline-seconds", "120", "--whole-cluster"]
    (workers,) = spec["workerGroupSpecs"]
    assert workers["replicas"] == 3
    worker = workers["template"]["spec"]
    assert worker["nodeSelector"] == {"spotray.dev/capacity": "spot"}
    assert worker["tolerations"] == [{"key": "spotray.dev/spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert worker["terminationGracePeriodSeconds"] == 120
    assert worker["securityContext"]["fsGroup"] == 1000
    container = worker["containers"][0]
    assert container["lifecycle"]["preStop"]["exec"]["command"][:3] == ["python", "-m", "spotray.train.launch.drain"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert container["volumeMounts"] == [{"name": "shared", "mountPath": "/mnt/shared"}]
    assert worker["volumes"] == [{"name": "shared", "persistentVolumeClaim": {"claimName": "team-scratch"}}]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("controller.replica=2",), "additional properties 'replica' not allowed"),
        (("s3.existingSecet=x",), "additional properties 'existingSecet' not allowed"),
        (("minio.persistance.size=1Gi",), "additional properties 'persistance' not allowed"),
        (("controller.submissionMode=SidecarMode",), "value must be one of 'K8sJobMode', 'HTTPMode'"),
        (("controller.replicas=0",), "minimum"),
        (("controller.logFormat=yaml",), "value must be one of 'json', 'text'"),
        (("controller.metricsPort=70000",), "maximum"),
        (("controller.watchNamespaces={Team_A}",), "does not match pattern"),
        (("s3.endpoint=minio:9000",), "does not match pattern"),
        (("sharedStorage.mountPath=mnt/shared",), "does not match pattern"),
        (("controller.fileRoots={/}",), "does not match pattern"),
        (("controller.fileRoots={mnt/shared}",), "does not match pattern"),
        (("ray.version=latest",), "does not match pattern"),
        (("ray.workers.tolerations[0].operator=Maybe",), "value must be one of 'Exists', 'Equal'"),
        (("controller.resources.limits.memory=lots",), "/controller/resources/limits/memory"),
        (("rayCluster.enabled=yes",), "got string, want boolean"),
    ],
)
def test_schema_refuses_typos_and_bad_values(helm: Path, sets: tuple[str, ...], message: str) -> None:
    stderr = refused(*sets)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr


def test_schema_closes_every_object_of_ours() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}")

    walk(schema, "values")


def test_every_value_is_documented() -> None:
    """A key without a `# --` comment above it must be a section whose keys are documented."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")
    undocumented = []
    skip_deeper_than: int | None = None
    for i, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue  # inside a documented value (e.g. resources.requests.cpu)
        skip_deeper_than = None
        previous = next((p.strip() for p in reversed(lines[:i]) if p.strip()), "")
        if previous.startswith("# --"):
            skip_deeper_than = indent
            continue
        following = next((n for n in lines[i + 1 :] if n.strip() and not n.strip().startswith("#")), "")
        child = key_line.match(following)
        if not (child and len(child.group(1)) > indent):
            undocumented.append(match.group(2))
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_kuberay_bundle_pins_the_operator_chart_and_points_at_this_chart() -> None:
    bundle = yaml.safe_load((ROOT / "charts" / "spotray-kuberay" / "Chart.yaml").read_text())
    deps = {d["name"]: d for d in bundle["dependencies"]}
    assert deps["kuberay-operator"]["version"] == "1.6.1"
    assert deps["kuberay-operator"]["condition"] == "kuberay-operator.enabled"
    assert deps["spotray"]["repository"] == "file://../spotray"
    assert deps["spotray"]["version"] == yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    # The KubeRay version the test bed runs (testbed/versions.env) is the one pinned here.
    assert tb.versions()["KUBERAY_VERSION"] == "v" + deps["kuberay-operator"]["version"]


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the chart renders, by '<Kind>/<name>[/<group>]'."""
    pods = {}
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            pods[name] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "RayCluster":
            pods[f"{name}/head"] = obj["spec"]["headGroupSpec"]["template"]["spec"]
            for group in obj["spec"]["workerGroupSpecs"]:
                pods[f"{name}/{group['groupName']}"] = group["template"]["spec"]
    return pods


# The shared volume's permissions hook chowns the volume once, as root with CHOWN and FOWNER only
# (charts/spotray/README.md): the one pod that cannot be "restricted"; it runs at install time.
NOT_RESTRICTED = {f"Job/{FULLNAME}-shared-permissions"}


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_every_pod_meets_pod_security_restricted(helm: Path, values_file: str) -> None:
    for name, pod in pod_specs(render(values_file)).items():
        if name not in NOT_RESTRICTED:
            assert restricted_violations(pod) == [], name


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def mounts_of(pod: dict[str, Any]) -> set[str]:
    return {
        m["mountPath"]
        for c in pod.get("containers", []) + pod.get("initContainers", [])
        for m in c.get("volumeMounts", [])
    }


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_ray_pods_of_the_long_lived_cluster_mount_no_api_token(helm: Path, values_file: str) -> None:
    # Jobs need no Kubernetes credentials, and the namespace's default ServiceAccount is not theirs (issue 38).
    for name, pod in pod_specs(render(values_file)).items():
        if name.startswith("RayCluster/"):
            assert pod["automountServiceAccountToken"] is False, name
            assert SERVICE_ACCOUNT_DIR not in mounts_of(pod), name


def test_with_autoscaling_only_kuberays_autoscaler_gets_the_heads_api_token(helm: Path) -> None:
    # raycluster.yaml turns autoscaling on: the autoscaler patches the RayCluster through the API.
    spec = only(render("raycluster.yaml"), "RayCluster")["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]
    (token,) = [v for v in head["volumes"] if "projected" in v]
    sources = token["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 3607} in [s.get("serviceAccountToken") for s in sources]
    assert spec["autoscalerOptions"]["volumeMounts"] == [
        {"name": token["name"], "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
    ]
    assert all(m["name"] != token["name"] for c in head["containers"] for m in c.get("volumeMounts", []))
    (workers,) = spec["workerGroupSpecs"]
    assert all("projected" not in v for v in workers["template"]["spec"].get("volumes", []))

    plain = only(render(None, "rayCluster.enabled=true"), "RayCluster")["spec"]
    assert "autoscalerOptions" not in plain
    assert "volumes" not in plain["headGroupSpec"]["template"]["spec"]


def test_allowed_secrets_and_endpoints_reach_the_controller(helm: Path) -> None:
    objects = render(None, "s3.allowedSecrets={team-a,team-b}", "s3.allowedEndpoints={http://minio.storage:9000}")
    config = ControllerConfig.from_env(controller_env(objects))
    assert config.allowed_s3_secrets == ("team-a", "team-b")
    assert config.s3_endpoints_allowed == ("http://minio.storage:9000",)
    # Without rbac.secretsByName the controller may get any Secret (to see the opt-in label).
    assert not [r for r in only(objects, "ClusterRole", FULLNAME)["rules"] if "resourceNames" in r]


def test_secrets_by_name_narrows_rbac_to_the_named_secrets(helm: Path) -> None:
    objects = render(None, "rbac.secretsByName=true", "s3.existingSecret=s3-credentials", "s3.allowedSecrets={team-a}")
    read, create = [r for r in only(objects, "ClusterRole", FULLNAME)["rules"] if "secrets" in r["resources"]]
    assert read == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get"],
        "resourceNames": ["s3-credentials", "team-a", "spotray-checkpoint-key"],  # the status checks signatures
    }
    # Creating each run's checkpoint key: a create cannot be narrowed by name (Kubernetes ignores
    # resourceNames for create), and it reads nothing.
    assert create == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}
    assert "rbac.secretsByName needs s3.existingSecret or s3.allowedSecrets" in refused("rbac.secretsByName=true")


def network_policies(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"] for o in objects if o["kind"] == "NetworkPolicy"
    }


def test_each_run_gets_its_policy_from_the_controller_and_none_spans_runs(helm: Path) -> None:
    """Policies add up, so a namespace-wide one for run pods would admit every run to every other:
    the chart renders none, and tells the controller to make one per run, with KubeRay as the peer."""
    objects = render(None, "controller.watchNamespaces={ml,cv}")
    assert not network_policies(objects)  # no MinIO, no RayCluster here: nothing for the chart to render
    config = ControllerConfig.from_env(controller_env(objects))
    assert config.run_network_policy
    assert config.kuberay_peer == {
        "namespaceSelector": {"matchLabels": {}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
    }
    for role in (o for o in objects if o["kind"] == "Role"):
        assert permissions(role)[("networking.k8s.io", "networkpolicies")] == {"create", "get"}
    off = render(None, "controller.watchNamespaces={ml,cv}", "networkPolicy.enabled=false")
    assert not ControllerConfig.from_env(controller_env(off)).run_network_policy
    assert all(("networking.k8s.io", "networkpolicies") not in permissions(o) for o in off if o["kind"] == "Role")


def test_minio_and_the_long_lived_cluster_get_policies_and_the_console_is_off(helm: Path) -> None:
    objects = render("raycluster.yaml")
    policies = network_policies(objects)
    minio = policies[(NAMESPACE, f"{FULLNAME}-minio")]
    (rule,) = minio["ingress"]
    assert rule["ports"] == [{"port": 9000}]
    assert (NAMESPACE, f"{FULLNAME}-raycluster") in policies
    service = only(objects, "Service", f"{FULLNAME}-minio")
    assert [p["port"] for p in service["spec"]["ports"]] == [9000]
    (container,) = only(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert {"name": "MINIO_BROWSER", "value": "off"} in container["env"]
    assert [p["containerPort"] for p in container["ports"]] == [9000]


def test_each_run_gets_a_checkpoint_key_and_the_right_to_make_it_goes_with_the_setting(helm: Path) -> None:
    objects = render(None, "controller.watchNamespaces={ml,cv}")
    assert ControllerConfig.from_env(controller_env(objects)).run_checkpoint_keys
    for role in (o for o in objects if o["kind"] == "Role"):
        assert permissions(role)[("", "secrets")] == {"get", "create"}
    off = render(None, "controller.watchNamespaces={ml,cv}", "checkpointKeys.enabled=false")
    assert not ControllerConfig.from_env(controller_env(off)).run_checkpoint_keys
    assert all(permissions(o)[("", "secrets")] == {"get"} for o in off if o["kind"] == "Role")


def test_an_operator_and_s3_clients_outside_the_pod_network_are_admitted_by_address(helm: Path) -> None:
    """A KubeRay operator on the host network matches no pod selector (the real-pods test bed's runs on
    the host): kuberayIPBlocks admits it to every run's Ray ports and the RayCluster's; minioIPBlocks
    lets a node's `spotray pull` reach MinIO. Nothing by default."""
    values = ("networkPolicy.kuberayIPBlocks={198.18.254.254/32}", "networkPolicy.minioIPBlocks={198.18.254.0/24}")
    objects = render("raycluster.yaml", *values)
    assert ControllerConfig.from_env(controller_env(objects)).kuberay_ip_blocks == ("198.18.254.254/32",)
    policies = network_policies(objects)
    ray_peers = policies[(NAMESPACE, f"{FULLNAME}-raycluster")]["ingress"][0]["from"]
    assert {"ipBlock": {"cidr": "198.18.254.254/32"}} in ray_peers
    (minio_rule,) = policies[(NAMESPACE, f"{FULLNAME}-minio")]["ingress"]
    assert minio_rule["from"][-1] == {"ipBlock": {"cidr": "198.18.254.0/24"}}
    assert minio_rule["ports"] == [{"port": 9000}]
    plain = network_policies(render("raycluster.yaml"))
    assert not [
        peer for spec in plain.values() for rule in spec["ingress"] for peer in rule["from"] if "ipBlock" in peer
    ]


def test_runs_egress_is_limited_to_https_and_the_charts_minio_unless_turned_off(helm: Path) -> None:
    https = {"ports": [{"port": 443, "protocol": "TCP"}]}
    assert ControllerConfig.from_env(controller_env(render(None))).run_egress == [https]
    with_minio = ControllerConfig.from_env(controller_env(render("minio.yaml"))).run_egress
    assert with_minio is not None
    assert with_minio[0] == https
    assert with_minio[1] == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                "podSelector": {
                    "matchLabels": {
                        "app.kubernetes.io/name": "spotray",
                        "app.kubernetes.io/instance": RELEASE,
                        "app.kubernetes.io/component": "minio",
                    }
                },
            }
        ],
        "ports": [{"port": 9000, "protocol": "TCP"}],
    }
    # The chart's long-lived RayCluster: the submitters of runs that use it post their jobs to its dashboard.
    shared = ControllerConfig.from_env(controller_env(render(None, "rayCluster.enabled=true"))).run_egress
    assert shared is not None
    assert shared[-1]["ports"] == [{"port": 8265, "protocol": "TCP"}]
    assert shared[-1]["to"][0]["podSelector"]["matchLabels"]["ray.io/is-ray-node"] == "yes"
    raycluster = only(render(None, "rayCluster.enabled=true"), "RayCluster")
    head_labels = raycluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    head_pod_labels = {**head_labels, "ray.io/is-ray-node": "yes"}  # KubeRay adds the last one
    assert shared[-1]["to"][0]["podSelector"]["matchLabels"].items() <= head_pod_labels.items()
    # The long-lived RayCluster's own pods get the same: their pods, DNS, and what runs may reach.
    shared_policy = network_policies(render(None, "rayCluster.enabled=true"))[(NAMESPACE, f"{FULLNAME}-raycluster")]
    assert shared_policy["policyTypes"] == ["Ingress", "Egress"]
    assert shared_policy["egress"][0]["to"] == shared_policy["ingress"][0]["from"][:1]  # its own head and workers
    assert shared_policy["egress"][1] == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert shared_policy["egress"][2:] == shared
    assert ControllerConfig.from_env(controller_env(render(None, "networkPolicy.egress=false"))).run_egress is None
    off = network_policies(render(None, "rayCluster.enabled=true", "networkPolicy.egress=false"))
    assert off[(NAMESPACE, f"{FULLNAME}-raycluster")]["policyTypes"] == ["Ingress"]


def test_network_policies_can_be_turned_off(helm: Path) -> None:
    assert not network_policies(render("raycluster.yaml", "networkPolicy.enabled=false"))


def test_people_get_trainingruns_and_sweeps_through_the_aggregated_roles_but_never_their_status(helm: Path) -> None:
    objects = render("defaults.yaml")
    edit = only(objects, "ClusterRole", f"{FULLNAME}-edit")
    view = only(objects, "ClusterRole", f"{FULLNAME}-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    ours = {("spotray.dev", "trainingruns"), ("spotray.dev", "trainingsweeps")}
    assert set(permissions(edit)) == set(permissions(view)) == ours
    for resource in ours:
        assert "patch" in permissions(edit)[resource]
        assert permissions(view)[resource] == {"get", "list", "watch"}
    # A namespaced install makes nothing cluster-wide unless asked.
    assert not [o for o in render("namespaced.yaml") if o["kind"] == "ClusterRole"]
    assert len([o for o in render("namespaced.yaml", "rbac.userRoles=true") if o["kind"] == "ClusterRole"]) == 2


def test_rays_token_auth_is_on_for_every_runs_cluster_and_the_charts_own(helm: Path) -> None:
    # Issue #38, item 2: KubeRay makes each cluster's token Secret; the controller needs no new right.
    objects = render(None, "rayCluster.enabled=true")
    assert ControllerConfig.from_env(controller_env(objects)).ray_token_auth
    assert only(objects, "RayCluster")["spec"]["authOptions"] == {"mode": "token"}
    off = render(None, "rayCluster.enabled=true", "rayTokenAuth.enabled=false")
    assert not ControllerConfig.from_env(controller_env(off)).ray_token_auth
    assert "authOptions" not in only(off, "RayCluster")["spec"]
    roles = [o for o in objects if o["kind"] in ("Role", "ClusterRole")]
    assert roles == [o for o in off if o["kind"] in ("Role", "ClusterRole")]


@pytest.mark.parametrize("period", [2, 3, 0])
def test_long_lived_ray_cluster_gets_the_controllers_readiness_probe(helm: Path, period: int) -> None:
    # The chart's RayCluster and the controller's (controller/rayjob.py) get the same probe.
    cluster = only(render("raycluster.yaml", f"ray.readinessPeriodSeconds={period}"), "RayCluster")["spec"]
    config = ControllerConfig(ray_readiness_period_seconds=period)
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    (workers,) = cluster["workerGroupSpecs"]
    worker = workers["template"]["spec"]["containers"][0]
    assert head.get("readinessProbe") == readiness_probe(config, head=True)
    assert worker.get("readinessProbe") == readiness_probe(config, head=False)
    old_ray = only(render("raycluster.yaml", "ray.version=2.52.0"), "RayCluster")["spec"]
    assert "readinessProbe" not in old_ray["headGroupSpec"]["template"]["spec"]["containers"][0]


# Each capacity preset (charts/spotray/templates/_helpers.tpl): the provider's labels and taints for
# on-demand nodes (heads, MinIO, on-demand workers) and spot nodes (spot workers).
SPOT_TAINT = [{"effect": "NoSchedule", "key": "spotray.dev/spot", "operator": "Exists"}]
GKE_TAINT = [{"effect": "NoSchedule", "key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true"}]
AKS_TAINT = [
    {"effect": "NoSchedule", "key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot"}
]
PRESETS: dict[str, tuple[dict[str, str], dict[str, str], list[dict[str, str]]]] = {
    "spotray": ({"spotray.dev/capacity": "on-demand"}, {"spotray.dev/capacity": "spot"}, SPOT_TAINT),
    "karpenter": ({"karpenter.sh/capacity-type": "on-demand"}, {"karpenter.sh/capacity-type": "spot"}, []),
    "gke": ({}, {"cloud.google.com/gke-spot": "true"}, GKE_TAINT),
    "eks": ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, {"eks.amazonaws.com/capacityType": "SPOT"}, []),
    "aks": ({}, {"kubernetes.azure.com/scalesetpriority": "spot"}, AKS_TAINT),
    "custom": ({}, {}, []),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_capacity_preset_puts_heads_minio_and_spot_workers_on_its_providers_nodes(helm: Path, preset: str) -> None:
    on_demand, spot, spot_tolerations = PRESETS[preset]
    objects = render(None, f"capacity.preset={preset}", "minio.enabled=true", "s3.existingSecret=s3")
    env = controller_env(objects)
    assert json.loads(env["SPOTRAY_HEAD_NODE_SELECTOR"]) == on_demand
    assert json.loads(env["SPOTRAY_HEAD_TOLERATIONS"]) == []
    assert json.loads(env["SPOTRAY_SPOT_NODE_SELECTOR"]) == spot
    assert json.loads(env["SPOTRAY_SPOT_TOLERATIONS"]) == spot_tolerations
    minio = only(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert minio.get("nodeSelector", {}) == on_demand
    # Through the controller's own reading of its environment, into a run's pods.
    rayjob = build_rayjob(training_run(), 1, "uid", ControllerConfig.from_env(env))
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"].get("nodeSelector", {}) == on_demand
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert worker.get("nodeSelector", {}) == spot
    assert worker.get("tolerations", []) == spot_tolerations


def test_a_components_own_placement_goes_over_the_presets(helm: Path) -> None:
    objects = render(
        None,
        "capacity.preset=karpenter",
        "ray.workers.nodeSelector.karpenter\\.sh/capacity-type=spot-gpu",
        "ray.workers.nodeSelector.pool=gpu",
        "ray.workers.tolerations[0].key=gpu",
        "ray.workers.tolerations[0].operator=Exists",
        "ray.head.nodeSelector.pool=system",
    )
    env = controller_env(objects)
    assert json.loads(env["SPOTRAY_SPOT_NODE_SELECTOR"]) == {"karpenter.sh/capacity-type": "spot-gpu", "pool": "gpu"}
    assert json.loads(env["SPOTRAY_SPOT_TOLERATIONS"]) == [{"key": "gpu", "operator": "Exists"}]
    assert json.loads(env["SPOTRAY_HEAD_NODE_SELECTOR"]) == {
        "karpenter.sh/capacity-type": "on-demand",
        "pool": "system",
    }


def test_an_unknown_preset_is_refused(helm: Path) -> None:
    assert "capacity.preset" in refused("capacity.preset=gcp") or "preset" in refused("capacity.preset=gcp")


def test_the_long_lived_ray_cluster_follows_the_preset(helm: Path) -> None:
    objects = render("raycluster.yaml", "capacity.preset=eks")
    spec = only(objects, "RayCluster")["spec"]
    assert spec["headGroupSpec"]["template"]["spec"]["nodeSelector"] == PRESETS["eks"][0]
    assert spec["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] == PRESETS["eks"][1]


EXAMPLES = ROOT / "charts" / "spotray" / "examples"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_each_clouds_example_values_render_with_the_readmes_cluster_quickstart(helm: Path, example: str) -> None:
    """The README's `helm install` line (its --set values) with each cloud's example values file in
    place of the one it names."""
    readme = (ROOT / "README.md").read_text()
    quickstart = readme[readme.index("helm install spotray charts/spotray") :].split("\n```")[0]
    sets = re.findall(r"--set (\S+)", quickstart)
    assert sets, quickstart
    assert "-f charts/spotray/examples/" in quickstart
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(EXAMPLES / example)]
    for item in sets:
        args += ["--set", item.replace("REGISTRY", "registry.example.com")]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    preset = yaml.safe_load((EXAMPLES / example).read_text())["capacity"]["preset"]
    assert preset == example.removesuffix(".yaml")
    env = controller_env([doc for doc in yaml.safe_load_all(result.stdout) if doc])
    assert json.loads(env["SPOTRAY_SPOT_NODE_SELECTOR"]) == PRESETS[preset][1]
