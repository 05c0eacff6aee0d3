"""`helm install` of charts/spotray into the test bed with the real helm binary: the CRDs and RBAC
exist, the controller's ServiceAccount may do exactly what the controller needs (`kubectl auth
can-i`), and `helm uninstall` leaves nothing behind but the CRDs.

The controller Deployment's pod becomes Running on a kwok node but runs nothing (pods never run a
container here); the last test runs the controller as a process, with the Deployment's settings and
the chart's ServiceAccount token, through a training run that loses its spot node.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.errors import SpotrayError
from spotray.train.storage.local_s3 import LocalS3Server
from tests.e2e.conftest import create_restricted_namespace, tb
from tests.e2e.controller_harness import SECRET, ControllerProcess, create_s3_secret, training_run
from tests.minio import ROOT_PASSWORD, ROOT_USER, Minio, minio_server, run_tenants_script
from tests.unit.test_chart import IMAGE

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spotray"

# (verb, resource) the controller must be allowed in the namespaces it serves.
ALLOWED_IN_NAMESPACE = [
    *[(verb, "trainingruns.spotray.dev") for verb in ("get", "list", "watch", "patch")],
    ("patch", "trainingruns.spotray.dev/status"),
    ("update", "trainingruns.spotray.dev/finalizers"),
    *[(verb, "rayjobs.ray.io") for verb in ("get", "list", "watch", "create", "delete", "patch")],
    *[(verb, "pods") for verb in ("list", "watch")],
    ("get", "secrets"),
    ("create", "secrets"),  # each run's checkpoint key (controller/checkpoint_key_secret.py)
    ("create", "events"),
    ("create", "networkpolicies.networking.k8s.io"),  # each run's own (controller/network_policy.py)
    ("get", "networkpolicies.networking.k8s.io"),  # its owner, when one of its name exists (attempt 2 here)
]
# Rights granted that the spot-loss run below does not call, each with the path that needs it.
NOT_CALLED_IN_THIS_RUN: dict[tuple[str, str], str] = {
    ("patch", "trainingruns.spotray.dev"): "kopf's finalizer on each run, kept with HA peering (replicas > 1)",
    ("create", "trainingruns.spotray.dev"): "a sweep's trials (tests/e2e/test_sweep.py)",
    ("get", "trainingsweeps.spotray.dev"): "a sweep's reconcile reads it (tests/e2e/test_sweep.py)",
    ("patch", "trainingsweeps.spotray.dev/status"): "a sweep's status (tests/e2e/test_sweep.py)",
    ("update", "trainingruns.spotray.dev/finalizers"): (
        "never a request: the OwnerReferencesPermissionEnforcement admission plugin (OpenShift) checks it "
        "when a RayJob whose owner reference blocks the run's deletion is created"
    ),
}
# ... and what it must not do anywhere.
DENIED = [
    ("list", "secrets"),
    ("patch", "events"),
    ("create", "events.events.k8s.io"),
    ("update", "secrets"),
    ("patch", "secrets"),
    ("delete", "secrets"),
    ("delete", "pods"),
    ("create", "pods"),
    ("create", "rayclusters.ray.io"),
    ("list", "rayclusters.ray.io"),
    ("update", "trainingruns.spotray.dev"),
    ("update", "trainingruns.spotray.dev/status"),
    ("delete", "trainingruns.spotray.dev"),
    ("create", "deployments.apps"),
]


def crd_names() -> list[str]:
    """Every CRD the chart ships in crds/ (kopf's peering CRDs; the TrainingRun CRD once generated)."""
    names = []
    for path in sorted((CHART / "crds").glob("*.yaml")):
        names += [doc["metadata"]["name"] for doc in yaml.safe_load_all(path.read_text()) if doc]
    return names


class Release:
    def __init__(self, testbed: tb.Testbed, namespace: str, name: str) -> None:
        self.testbed = testbed
        self.namespace = namespace
        self.name = name
        self.service_account = f"system:serviceaccount:{namespace}:{name}-spotray"

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        helm = [str(tb.binary("helm")), "--kubeconfig", str(self.testbed.kubeconfig), "--namespace", self.namespace]
        if args[0] in ("install", "upgrade"):
            args = (*args, *IMAGE)  # the chart refuses to install without an image (kwok pulls none)
        result = subprocess.run([*helm, *args], capture_output=True, text=True, check=False, timeout=300)
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stdout}\n{result.stderr}"
        return result

    def can_i(self, verb: str, resource: str, namespace: str | None) -> bool:
        scope = ["--namespace", namespace] if namespace else []
        resource, _, subresource = resource.partition("/")
        if subresource:
            scope += ["--subresource", subresource]
        result = self.testbed.kubectl(
            "auth", "can-i", verb, resource, "--as", self.service_account, *scope, check=False
        )
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), result.stderr
        return answer == "yes"

    def leftovers_after_uninstall(self, kept: tuple[str, ...] = (), timeout_s: float = 90) -> list[str]:
        """What is left of the release once the garbage collector is done with it: helm deletes a
        Deployment and returns (its ``--wait`` waits for that object), and its ReplicaSet's pods go
        after it, which on a loaded machine took more than the moment before the check (a cold CI
        run saw one controller pod still there). Polls until only ``kept`` is left, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.leftovers()
            if sorted(left) == sorted(kept) or time.monotonic() > deadline:
                return left
            time.sleep(2)

    def leftovers(self) -> list[str]:
        """Objects of this release still in the cluster (labelled by the chart, or helm's own records)."""
        kinds = ",".join(
            [
                *("all", "serviceaccounts", "roles", "rolebindings", "clusterroles", "clusterrolebindings"),
                *("secrets", "configmaps", "pvc", "pv", "networkpolicies"),
            ]
        )
        selector = f"app.kubernetes.io/instance={self.name}"
        found = self.testbed.kubectl("get", kinds, "-A", "-l", selector, "-o", "name").stdout.split()
        found += self.testbed.kubectl(
            "get", "clusterkopfpeerings,kopfpeerings", "-A", "-l", selector, "-o", "name"
        ).stdout.split()
        found += self.testbed.kubectl(
            "get", "secrets", "-n", self.namespace, "-l", f"owner=helm,name={self.name}", "-o", "name"
        ).stdout.split()
        return found


@pytest.fixture
def release(testbed: tb.Testbed, namespace: str) -> Iterator[Release]:
    rel = Release(testbed, namespace, f"sr{uuid.uuid4().hex[:6]}")
    yield rel
    # Cluster-scoped objects outlive the namespace: uninstall whatever the test left installed.
    subprocess.run(
        [str(tb.binary("helm")), "--kubeconfig", str(testbed.kubeconfig), "-n", namespace, "uninstall", rel.name],
        capture_output=True,
        check=False,
    )


def test_cluster_wide_install_with_ha_grants_the_controller_exactly_its_permissions(
    testbed: tb.Testbed, release: Release
) -> None:
    release.helm("install", release.name, str(CHART), "--set", "controller.replicas=2", "--wait", "--timeout", "3m")

    for crd in crd_names():
        testbed.kubectl("get", "crd", crd)
    deployment = json.loads(
        testbed.kubectl(
            "get", "deployment", f"{release.name}-spotray-controller", "-n", release.namespace, "-o", "json"
        ).stdout
    )
    assert deployment["status"]["readyReplicas"] == 2  # kwok's pods: Running and Ready, running nothing
    testbed.kubectl("get", "clusterrole", f"{release.name}-spotray")
    testbed.kubectl("get", "clusterrolebinding", f"{release.name}-spotray")
    testbed.kubectl("get", "clusterkopfpeering", f"{release.name}-spotray")

    # Cluster-wide: the same rights in any namespace, plus the peering objects; no nodes, no CRDs.
    other = "default"
    for verb, resource in ALLOWED_IN_NAMESPACE:
        assert release.can_i(verb, resource, release.namespace), (verb, resource)
        assert release.can_i(verb, resource, other), (verb, resource, other)
    assert not release.can_i("list", "nodes", None)
    assert not release.can_i("list", "customresourcedefinitions.apiextensions.k8s.io", None)
    for verb in ("get", "list", "watch", "patch"):
        assert release.can_i(verb, "clusterkopfpeerings.kopf.dev", None)
    for verb, resource in DENIED:
        assert not release.can_i(verb, resource, release.namespace), (verb, resource)
    assert not release.can_i("delete", "nodes", None)

    release.helm("uninstall", release.name, "--wait")
    assert release.leftovers_after_uninstall() == []
    # What helm uninstall keeps, by design (docs/deploy.md): the CRDs from crds/.
    for crd in crd_names():
        testbed.kubectl("get", "crd", crd)


def test_namespaced_install_grants_rights_only_in_the_watched_namespace(
    testbed: tb.Testbed, release: Release, namespace: str
) -> None:
    watched = f"{namespace[:50]}-runs"
    create_restricted_namespace(testbed, watched)
    try:
        release.helm(
            "install", release.name, str(CHART), "--set", f"controller.watchNamespaces={{{watched}}}", "--wait"
        )
        testbed.kubectl("get", "role", f"{release.name}-spotray", "-n", watched)
        env = json.loads(
            testbed.kubectl(
                "get", "deployment", f"{release.name}-spotray-controller", "-n", namespace, "-o", "json"
            ).stdout
        )["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "SPOTRAY_NAMESPACES", "value": watched} in env
        # Run pods get their policies from the controller, one per run (the spot-loss test below sees
        # one made); the chart renders none that would admit every run of the namespace.
        assert {"name": "SPOTRAY_RUN_NETWORK_POLICY", "value": "true"} in env
        # Ray's token auth on every run's cluster (KubeRay makes the token; real pods check it is enforced).
        assert {"name": "SPOTRAY_RAY_TOKEN_AUTH", "value": "true"} in env
        assert testbed.kubectl("get", "networkpolicies", "-n", watched, "-o", "name").stdout.split() == []

        for verb, resource in ALLOWED_IN_NAMESPACE:
            assert release.can_i(verb, resource, watched), (verb, resource)
        # Not in its own namespace, not cluster-wide, no nodes, no CRDs.
        assert not release.can_i("list", "trainingruns.spotray.dev", namespace)
        assert not release.can_i("list", "trainingruns.spotray.dev", None)
        assert not release.can_i("list", "nodes", None)
        assert not release.can_i("list", "customresourcedefinitions.apiextensions.k8s.io", None)
        for verb, resource in DENIED:
            assert not release.can_i(verb, resource, watched), (verb, resource)

        release.helm("uninstall", release.name, "--wait")
        assert release.leftovers_after_uninstall() == []
    finally:
        testbed.kubectl("delete", "namespace", watched, "--wait=false", check=False)


def test_the_installed_controller_runs_a_training_run_through_a_spot_loss_with_only_its_own_rights(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    release: Release,
    namespace: str,
    s3_server: LocalS3Server,
    tmp_path: Path,
) -> None:
    """helm install -> the controller as a process with the Deployment's settings and the chart's
    ServiceAccount token -> a TrainingRun -> its spot node deleted mid-run -> attempt 2 -> Succeeded
    -> helm uninstall leaves only the CRDs."""
    runs = f"{namespace[:50]}-runs"
    create_restricted_namespace(testbed, runs)
    try:
        release.helm(
            "install", release.name, str(CHART), "--wait",
            "--set", f"controller.watchNamespaces={{{runs}}}", "--set", f"s3.existingSecret={SECRET}",
            "--set-json", f"s3.allowedEndpoints={json.dumps([s3_server.endpoint_url])}",
        )  # fmt: skip
        # The chart's own s3.existingSecret needs no opt-in label: the operator named it.
        create_s3_secret(testbed, runs, s3_server, opt_in=False)
        deployment = json.loads(
            testbed.kubectl(
                "get", "deployment", f"{release.name}-spotray-controller", "-n", namespace, "-o", "json"
            ).stdout
        )
        pod_spec = deployment["spec"]["template"]["spec"]
        chart_env = {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"] if "value" in e}
        kubeconfig = testbed.service_account_kubeconfig(
            namespace, pod_spec["serviceAccountName"], tmp_path / "controller.kubeconfig"
        )
        # Ports are the machine's to give here (several controllers run side by side in the tests).
        ports = ("SPOTRAY_HEALTH_PORT", "SPOTRAY_METRICS_PORT")
        settings = {
            **{name: value for name, value in chart_env.items() if name not in ports},
            "SPOTRAY_SUBMISSION_MODE": "HTTPMode",  # kwok runs no submitter pod
            "SPOTRAY_RECONCILE_INTERVAL_SECONDS": "1",
            "SPOTRAY_SETTLE_SECONDS": "2",
        }
        controller = ControllerProcess(kubeconfig, runs, tmp_path / "controller.log", settings).start()
        try:
            sleeper = "python -c 'import time; time.sleep(15)'"
            testbed.apply(training_run("chart-run", tmp_path, max_steps=10, entrypoint=sleeper), namespace=runs)
            running = tb.wait_until(
                "attempt 1 to run",
                lambda: (s := run_status(testbed, runs)).get("phase") == "Running" and s,
                timeout=120,
            )
            job = json.loads(testbed.kubectl("get", "rayjob", running["rayJob"], "-n", runs, "-o", "json").stdout)
            pods = json.loads(
                testbed.kubectl("get", "pods", "-n", runs, "-l", "spotray.dev/attempt=1", "-o", "json").stdout
            )
            spot = next(
                p["spec"]["nodeName"] for p in pods["items"] if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
            )
            testbed.preempt_node(spot)
            try:
                assert ray_head.kill_job(job["status"]["jobId"])
                done = tb.wait_until(
                    "the run to finish",
                    lambda: (s := run_status(testbed, runs)).get("phase") in ("Succeeded", "Failed") and s,
                    timeout=180,
                )
            finally:
                testbed.restore_node(spot)
        finally:
            controller.stop()
            print(controller.log_tail(40))
        assert done["phase"] == "Succeeded", done
        assert [(a["outcome"], a["reason"]) for a in done["attempts"]] == [
            ("Preempted", "NodeLost"),
            ("Succeeded", "TrainingFinished"),
        ]
        assert "Forbidden" not in controller.log_path.read_text()
        # The run's own NetworkPolicy, made before its first RayJob and accepted by the API server (no
        # CNI here enforces it): only the run's pods and KubeRay's reach them; it goes with the run.
        policy = json.loads(testbed.kubectl("get", "networkpolicy", "chart-run-ray", "-n", runs, "-o", "json").stdout)
        run_pods = {"matchLabels": {"spotray.dev/run": "chart-run", "app.kubernetes.io/managed-by": "spotray"}}
        assert policy["spec"]["podSelector"] == run_pods
        assert policy["spec"]["ingress"][0]["from"][0] == {"podSelector": run_pods}
        run_uid = json.loads(testbed.kubectl("get", "trainingrun", "chart-run", "-n", runs, "-o", "json").stdout)
        assert policy["metadata"]["ownerReferences"][0]["uid"] == run_uid["metadata"]["uid"]
        # The namespace's checkpoint key (checkpointKeys.enabled): made once, owned by nothing (it outlives
        # the run, as its checkpoints do), immutable.
        key_secret = json.loads(
            testbed.kubectl("get", "secret", "spotray-checkpoint-key", "-n", runs, "-o", "json").stdout
        )
        assert "ownerReferences" not in key_secret["metadata"]
        assert key_secret["immutable"] is True
        run_key = base64.b64decode(key_secret["data"]["key"]).decode()
        rayjobs = json.loads(testbed.kubectl("get", "rayjobs", "-n", runs, "-o", "json").stdout)["items"]
        assert rayjobs, "no RayJob of the run is left to read"
        assert all(job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"} for job in rayjobs)
        # The rights the Role grants, against the requests the API server's audit log saw the
        # controller make in this run (the list is derived from a run, not from reading the code).
        requests = testbed.requests_by(release.service_account)
        assert [r for r in requests if r.get("responseStatus", {}).get("code") in (401, 403)] == []
        used = rights_used(requests)
        granted = rights_granted(json.loads(testbed.kubectl("get", "role", "-n", runs, "-o", "json").stdout))
        assert used <= granted, f"used but not granted: {used - granted}"
        assert granted - used == set(NOT_CALLED_IN_THIS_RUN), (
            f"granted, not called: {sorted(granted - used)}; documented: {sorted(NOT_CALLED_IN_THIS_RUN)}"
        )
        # No credential anywhere a person or another tenant reads: the controller's log, the run's
        # status, Events and RayJobs (which name the Secret, never copy it).
        readable = [
            controller.log_path.read_text(),
            json.dumps(done),
            testbed.kubectl("get", "events", "-n", runs, "-o", "json").stdout,
            testbed.kubectl("get", "rayjobs", "-n", runs, "-o", "json").stdout,
        ]
        # (The test server's access key id is the word "spotray"; ids are masked by unit tests.)
        assert not [text[:200] for text in readable if s3_server.secret_key in text or run_key in text]

        release.helm("uninstall", release.name, "--wait")
        assert release.leftovers_after_uninstall() == []
    finally:
        testbed.kubectl("delete", "namespace", runs, "--wait=false", check=False)


def qualified(resource: str, group: str) -> str:
    """``trainingruns`` + ``spotray.dev`` -> ``trainingruns.spotray.dev``; subresources after a slash."""
    name, _, subresource = resource.partition("/")
    return (f"{name}.{group}" if group else name) + (f"/{subresource}" if subresource else "")


def rights_used(requests: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(verb, resource) of each audited request on a resource (discovery requests have no objectRef)."""
    used = set()
    for request in requests:
        ref = request.get("objectRef")
        if ref:
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            used.add((request["verb"], qualified(resource, ref.get("apiGroup", ""))))
    return used


def rights_granted(role_list: dict[str, Any]) -> set[tuple[str, str]]:
    """(verb, resource) of every rule of the Roles in ``role_list`` (kubectl get role -o json)."""
    return {
        (verb, qualified(resource, group))
        for role in role_list["items"]
        for rule in role["rules"]
        for group in rule.get("apiGroups", [""])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def run_status(testbed: tb.Testbed, namespace: str) -> dict[str, Any]:
    run = json.loads(testbed.kubectl("get", "trainingrun", "chart-run", "-n", namespace, "-o", "json").stdout)
    status: dict[str, Any] = run.get("status") or {}
    return status


def test_a_restricted_namespace_refuses_a_pod_that_is_not_restricted(testbed: tb.Testbed, namespace: str) -> None:
    """The label is real: the test bed's API server enforces it, so the runs above prove our pods pass."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    created = testbed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(pod), check=False)
    assert created.returncode != 0
    assert "violates PodSecurity" in created.stderr, created.stderr


def secret_data(testbed: tb.Testbed, namespace: str, name: str) -> dict[str, str]:
    secret = json.loads(testbed.kubectl("get", "secret", name, "-n", namespace, "-o", "json").stdout)
    return {key: base64.b64decode(value).decode() for key, value in secret.get("data", {}).items()}


def run_hook_job_as_the_kubelet_would(
    testbed: tb.Testbed, release: Release, job_name: str, minio: Minio, work: Path
) -> subprocess.CompletedProcess[str]:
    """The installed release's hook Job, run here: its command, its script from the ConfigMap, its
    env with every secretKeyRef read from the cluster, its Secret volume as files. The one change:
    MINIO_URL is the local MinIO, not the in-cluster Service (kwok runs no container)."""
    hooks = [doc for doc in yaml.safe_load_all(release.helm("get", "hooks", release.name).stdout) if doc]
    job = next(h for h in hooks if h["kind"] == "Job" and h["metadata"]["name"] == job_name)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    env = {}
    for item in container["env"]:
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_data(testbed, release.namespace, ref["name"])[ref["key"]]
        else:
            env[item["name"]] = item["value"]
    env["MINIO_URL"] = minio.url
    shell, script_path, *pairs = container["command"]
    assert shell == "/bin/sh"
    scripts = mounts[str(Path(script_path).parent)]["configMap"]["name"]
    configmap = json.loads(testbed.kubectl("get", "configmap", scripts, "-n", release.namespace, "-o", "json").stdout)
    script = work / "script.sh"
    script.write_text(configmap["data"][Path(script_path).name])
    keys = secret_data(testbed, release.namespace, mounts[env.pop("TENANT_KEYS_DIR")]["secret"]["secretName"])
    env.pop("MC_CONFIG_DIR")
    return run_tenants_script(work, pairs, keys, env, script=script)


def test_minio_tenants_hold_their_own_user_kept_across_upgrades_and_a_secret_not_ours_is_never_taken(
    testbed: tb.Testbed, release: Release, namespace: str, tmp_path: Path
) -> None:
    """helm install with minio.tenants -> each tenant namespace has its own user's Secret -> the
    hook Job (run here against a real MinIO, see run_hook_job_as_the_kubelet_would) makes the users
    -> a tenant's keys work in its bucket alone -> helm upgrade keeps the keys. A tenant namespace
    holding a Secret of that name that the chart did not make fails the install and keeps it as it was."""
    tenants = [f"{namespace[:50]}-t{i}" for i in (1, 2)]
    for tenant in tenants:
        create_restricted_namespace(testbed, tenant)
    try:
        with minio_server(tmp_path / "minio") as minio:
            testbed.kubectl(
                "create", "secret", "generic", "s3-credentials", "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={ROOT_USER}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={ROOT_PASSWORD}",
            )  # fmt: skip
            # Not --wait, and no hooks: kwok runs no container, so MinIO never gets ready here.
            values = [
                "--no-hooks", "--set", "minio.enabled=true", "--set", "s3.existingSecret=s3-credentials",
                "--set-json", f"minio.tenants={json.dumps([{'namespace': t} for t in tenants])}",
            ]  # fmt: skip
            # A Secret of that name that the operator made: never read, never overwritten.
            testbed.kubectl(
                "create", "secret", "generic", "s3-credentials", "-n", tenants[1],
                "--from-literal=AWS_ACCESS_KEY_ID=theirs", "--from-literal=AWS_SECRET_ACCESS_KEY=their-secret",
            )  # fmt: skip
            helm = [str(tb.binary("helm")), "--kubeconfig", str(testbed.kubeconfig), "-n", namespace]
            refused = subprocess.run(
                [*helm, "install", release.name, str(CHART), *values, *IMAGE],
                capture_output=True,
                text=True,
                check=False,
            )
            assert refused.returncode != 0
            assert "exists and cannot be imported into the current release" in refused.stderr, refused.stderr
            assert secret_data(testbed, tenants[1], "s3-credentials")["AWS_SECRET_ACCESS_KEY"] == "their-secret"
            subprocess.run([*helm, "uninstall", release.name], capture_output=True, check=False)
            testbed.kubectl("delete", "secret", "s3-credentials", "-n", tenants[1])

            notes = release.helm("install", release.name, str(CHART), *values).stdout
            assert f'Namespace {tenants[0]}: its own MinIO user (Secret "s3-credentials" there)' in notes, notes
            assert "9001" not in notes, "NOTES show the MinIO console, which is off"
            installed = {t: secret_data(testbed, t, "s3-credentials") for t in tenants}
            hook = run_hook_job_as_the_kubelet_would(
                testbed, release, f"{release.name}-spotray-minio-tenants", minio, tmp_path
            )
            assert hook.returncode == 0, hook.stdout + hook.stderr

            for tenant, other in (tenants, tenants[::-1]):
                keys = installed[tenant]
                assert keys["AWS_ACCESS_KEY_ID"] == f"spotray-tenant-{tenant}"
                as_tenant = (keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"])
                own = minio.store(f"s3://{tenant}/runs/r", *as_tenant)
                own.check()
                own.put_bytes("progress.json", b"{}")
                with pytest.raises(SpotrayError, match="refused"):
                    minio.store(f"s3://{other}/runs/r", *as_tenant).put_bytes("progress.json", b"{}")

            release.helm("upgrade", release.name, str(CHART), *values)
            assert {t: secret_data(testbed, t, "s3-credentials") for t in tenants} == installed, "keys changed"
            hook = run_hook_job_as_the_kubelet_would(
                testbed, release, f"{release.name}-spotray-minio-tenants", minio, tmp_path
            )
            assert hook.returncode == 0, hook.stdout + hook.stderr
            keys = installed[tenants[0]]
            own = minio.store(f"s3://{tenants[0]}/runs/r", keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"])
            assert own.get_bytes("progress.json") == b"{}"

            release.helm("uninstall", release.name)
            # MinIO's data volume outlives the release, as a StatefulSet's claims do: checkpoints live there.
            claim = f"persistentvolumeclaim/data-{release.name}-spotray-minio-0"
            assert release.leftovers_after_uninstall(kept=(claim,)) == [claim]
    finally:
        for tenant in tenants:
            testbed.kubectl("delete", "namespace", tenant, "--wait=false", check=False)
