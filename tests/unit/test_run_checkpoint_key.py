"""controller/checkpoint_key.py: each run's checkpoint key, made once, given to its pods by reference.

Issue #38, item 4. The key's use (signing, refusing forged checkpoints) is tests/unit/test_checkpoint_key.py;
here the controller's part: the Secret made before the run's first RayJob and never again, owned by the
run, immutable; every Ray container referencing it (optional, so a run without one goes on); a Secret
of that name that is not the run's holding the RayJob back; the API server's refusal too.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException, V1ObjectMeta, V1OwnerReference, V1Secret

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, CheckpointKey
from spotray.contract.names import API_VERSION, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.spec import parse_training_run
from spotray.contract.uris import parse_uri
from spotray.controller import reconcile
from spotray.controller.checkpoint_key import build_checkpoint_key_secret, new_checkpoint_key
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.rayjob import build_rayjob
from spotray.controller.s3_access import SecretView
from spotray.train.checkpoints.checkpoint import upload_checkpoint
from spotray.train.storage.store import LocalObjectStore
from tests.conftest import write_files
from tests.unit.test_status_unreadable import FakeCluster, body

pytestmark = pytest.mark.unit

KEYED = {"run_checkpoint_keys": True}


def ray_containers(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [container for group in groups for container in group["template"]["spec"]["containers"]]


def test_the_key_secret_is_the_runs_immutable_and_holds_a_fresh_random_key(tmp_path: Path) -> None:
    run = parse_training_run(body(tmp_path, None))
    key = new_checkpoint_key()
    secret = build_checkpoint_key_secret(run, "uid-1", key)
    assert secret["metadata"]["name"] == "r-checkpoint-key"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with the run
    assert secret["immutable"] is True
    stored = base64.b64decode(secret["data"]["key"]).decode()
    assert stored == key
    assert CheckpointKey.from_env({CHECKPOINT_KEY_ENV: stored}) is not None  # long enough to be used
    assert new_checkpoint_key() != key


def test_every_ray_container_gets_the_key_by_reference_and_the_rayjob_holds_no_key(tmp_path: Path) -> None:
    run = parse_training_run(body(tmp_path, None))
    rayjob = build_rayjob(run, 1, "uid-1", ControllerConfig(**KEYED))  # type: ignore[arg-type]
    for container in ray_containers(rayjob):
        [item] = [e for e in container["env"] if e["name"] == CHECKPOINT_KEY_ENV]
        assert item["valueFrom"]["secretKeyRef"] == {"name": "r-checkpoint-key", "key": "key", "optional": True}
    plain = build_rayjob(run, 1, "uid-1", ControllerConfig())
    assert all(CHECKPOINT_KEY_ENV not in str(container) for container in ray_containers(plain))


class KeyCluster(FakeCluster):
    """The fake API server, plus Secrets: ``existing`` is one already there with those owner UIDs."""

    def __init__(self, run_body: dict[str, Any], existing: list[str] | None = None, refuse: int | None = None) -> None:
        super().__init__(run_body)
        self.calls: list[str] = []
        self.secrets: list[dict[str, Any]] = []
        self.existing = existing
        self.refuse = refuse
        self.key_name = parse_training_run(run_body).checkpoint_key_secret

    def create_checkpoint_key_secret(self, secret: dict[str, Any]) -> list[str] | None:
        self.calls.append("secret")
        # The real Cluster's handling of the API server's answers, over this fake's "server".
        real = Cluster.__new__(Cluster)
        real.core = self  # type: ignore[assignment]
        return Cluster.create_checkpoint_key_secret(real, secret)

    def create_namespaced_secret(self, namespace: str, secret: dict[str, Any], **_: Any) -> None:
        if self.refuse is not None:
            error = ApiException(status=self.refuse, reason="Forbidden")
            error.body = '{"reason": "Forbidden", "message": "secrets is forbidden: cannot create"}'
            raise error
        if self.existing is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.secrets.append(secret)

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> V1Secret:
        assert (namespace, name) == ("ns", self.key_name), "the Secret the run's key is in"
        if self.existing == ["unreadable"]:
            raise ApiException(status=403, reason="Forbidden")
        owners = [V1OwnerReference(api_version="v1", kind="Thing", name="t", uid=uid) for uid in self.existing or []]
        return V1Secret(metadata=V1ObjectMeta(name=name, owner_references=owners or None))

    def create_rayjob(self, rayjob: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("rayjob")
        return super().create_rayjob(rayjob)


def test_the_key_is_made_before_the_runs_first_rayjob_and_owned_by_the_run(tmp_path: Path) -> None:
    fake = KeyCluster(body(tmp_path, None))
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]
    assert fake.secrets[0]["metadata"]["ownerReferences"][0]["uid"] == fake.run["metadata"]["uid"]


def test_no_later_attempt_makes_a_key_so_a_run_never_changes_keys(tmp_path: Path) -> None:
    """A new key would refuse every checkpoint the run has: a run whose key is gone (or that began
    before keys) goes on without one, its pods' reference being optional."""
    fake = KeyCluster(body(tmp_path, None))
    run, uid = parse_training_run(fake.run), fake.run["metadata"]["uid"]
    config = ControllerConfig(**KEYED)  # type: ignore[arg-type]
    reconcile._create(fake, run, uid, config, build_rayjob(run, 2, uid, config), attempt=2)  # type: ignore[arg-type]
    assert fake.calls == ["rayjob"]


def test_a_key_secret_left_by_this_run_is_taken_as_made(tmp_path: Path) -> None:
    """The controller stopped between the Secret and the RayJob: the restart finds its own Secret."""
    run_body = body(tmp_path, None)
    fake = KeyCluster(run_body, existing=[run_body["metadata"]["uid"]])
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]


@pytest.mark.parametrize("owners", [["uid-of-a-deleted-namesake"], []], ids=["namesake", "user-made"])
def test_a_secret_of_that_name_not_the_runs_holds_the_rayjob_back_saying_so(tmp_path: Path, owners: list[str]) -> None:
    fake = KeyCluster(body(tmp_path, None), existing=owners)
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret"]
    assert fake.rayjobs == {}
    status = fake.run["status"]
    assert status["phase"] == "Pending"
    assert "Secret ns/r-checkpoint-key exists and is not this run's" in status["message"]
    assert "kubectl -n ns delete secret r-checkpoint-key" in status["message"]


def test_a_key_secret_the_api_server_refuses_holds_the_rayjob_back(tmp_path: Path) -> None:
    fake = KeyCluster(body(tmp_path, None), refuse=403)
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret"]
    assert fake.rayjobs == {}
    assert "Secret r-checkpoint-key: secrets is forbidden" in fake.run["status"]["message"]


def test_the_setting_comes_from_the_chart_and_the_shared_ray_cluster_gets_no_key(tmp_path: Path) -> None:
    assert ControllerConfig.from_env({"SPOTRAY_RUN_CHECKPOINT_KEYS": "true"}).run_checkpoint_keys
    assert not ControllerConfig.from_env({}).run_checkpoint_keys
    fake = KeyCluster(body(tmp_path, None))
    fake.reconcile(fake.config(**KEYED, ray_cluster_selector={"ray.io/cluster": "shared"}))
    assert fake.calls == ["rayjob"]


def test_a_key_secret_whose_owner_the_controller_may_not_read_is_taken_as_the_runs(tmp_path: Path) -> None:
    """rbac.secretsByName narrows `get` to the named Secrets: the owner of a leftover key cannot be read."""
    fake = KeyCluster(body(tmp_path, None), existing=["unreadable"])
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]


def test_the_fakes_stand_in_for_calls_the_kubernetes_client_has() -> None:
    """The fakes above answer the calls controller/kube.py makes; these are the client's own (a
    call_api with another client version's arguments passed every unit test and failed on real pods)."""
    from kubernetes import client  # noqa: PLC0415

    for api, method in [
        (client.CoreV1Api, "create_namespaced_secret"),
        (client.CoreV1Api, "read_namespaced_secret"),
        (client.NetworkingV1Api, "create_namespaced_network_policy"),
        (client.NetworkingV1Api, "read_namespaced_network_policy"),
    ]:
        assert callable(getattr(api, method, None)), f"{api.__name__}.{method}"


class SecretKeyCluster(FakeCluster):
    """A running attempt, and the run's key Secret as the API server answers its read."""

    def __init__(self, run_body: dict[str, Any], key: str | None, refuse: int | None = None) -> None:
        super().__init__(run_body)
        self.key = key
        self.refuse = refuse
        self.add_rayjob(1, "RUNNING", "Running")

    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> SecretView | None:  # type: ignore[override]
        assert (namespace, name) == ("ns", "r-checkpoint-key")
        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="Forbidden" if self.refuse == 403 else "Internal")
        return None if self.key is None else SecretView(name, {}, {"key": self.key})


RUNNING = {"phase": "Running", "attempt": 1, "rayJob": "r-a1", "observedGeneration": 1, "attempts": [{"attempt": 1}]}


@pytest.mark.parametrize(
    ("key", "refuse", "shown"),
    [("k" * 64, None, 10), (None, None, 20), ("k" * 64, 403, 20)],
    ids=["the-runs-key", "a-run-without-a-key", "a-key-the-controller-may-not-read"],
)
def test_the_status_shows_the_newest_checkpoint_the_run_signed_not_a_forged_newer_one(
    tmp_path: Path, key: str | None, refuse: int | None, shown: int
) -> None:
    """A writer of the bucket forges checkpoint-20 beside the run's signed checkpoint-10: no resume
    takes it, and with the run's key neither does the status. Without a key (a run begun before
    keys; rbac.secretsByName), the status shows what the store shows, as before."""
    fake = SecretKeyCluster(body(tmp_path, dict(RUNNING)), key, refuse)
    uri = parse_uri(fake.run["spec"]["checkpoint"]["uri"])
    run_store = LocalObjectStore(uri, checkpoint_key=CheckpointKey(b"k" * 64))
    upload_checkpoint(run_store, write_files(tmp_path / "genuine", {"model.safetensors": b"m" * 100}), 10, world_size=1)
    forged = write_files(tmp_path / "forged", {"model.safetensors": b"M" * 100})
    upload_checkpoint(LocalObjectStore(uri), forged, 20, world_size=1)
    fake.reconcile(fake.config(**KEYED))
    assert fake.run["status"]["lastCheckpoint"]["step"] == shown, fake.run["status"]


def test_a_key_read_the_api_server_fails_is_retried_not_taken_as_no_key(tmp_path: Path) -> None:
    fake = SecretKeyCluster(body(tmp_path, dict(RUNNING)), "k" * 64, refuse=500)
    uri = parse_uri(fake.run["spec"]["checkpoint"]["uri"])
    upload_checkpoint(LocalObjectStore(uri), write_files(tmp_path / "forged", {"m": b"M"}), 20, world_size=1)
    fake.reconcile(fake.config(**KEYED))
    status = fake.run["status"]
    assert "lastCheckpoint" not in status, status  # not the unsigned one: unknown until the key is read
    assert "cannot read the run's checkpoint key, Secret ns/r-checkpoint-key: 500" in json.dumps(status), status


def trial_body(tmp_path: Path, sweep_uid: str | None = "sweep-uid") -> dict[str, Any]:
    """A sweep's trial: labelled with its sweep, which is its controller owner (unless ``sweep_uid`` is None)."""
    trial = body(tmp_path, None)
    trial["metadata"]["labels"] = {**(trial["metadata"].get("labels") or {}), SWEEP_LABEL: "lr-sweep"}
    if sweep_uid is not None:
        owner = {
            "apiVersion": API_VERSION,
            "kind": SWEEP_KIND,
            "name": "lr-sweep",
            "uid": sweep_uid,
            "controller": True,
        }
        trial["metadata"]["ownerReferences"] = [owner]
    return trial


def test_a_sweeps_trials_share_one_key_owned_by_the_sweep(tmp_path: Path) -> None:
    """Population-based training resumes a trial from another trial's checkpoint: its job must be able to
    check that checkpoint's manifest, so every trial of a sweep signs and checks with the sweep's key."""
    run = parse_training_run(trial_body(tmp_path))
    secret = build_checkpoint_key_secret(run, "trial-uid", new_checkpoint_key())
    assert secret["metadata"]["name"] == "lr-sweep-sweep-checkpoint-key"
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (SWEEP_KIND, "lr-sweep", "sweep-uid"), "deleted with it"
    assert secret["metadata"]["labels"][SWEEP_LABEL] == "lr-sweep"
    rayjob = build_rayjob(run, 1, "trial-uid", ControllerConfig(**KEYED))  # type: ignore[arg-type]
    for container in ray_containers(rayjob):
        [item] = [e for e in container["env"] if e["name"] == CHECKPOINT_KEY_ENV]
        assert item["valueFrom"]["secretKeyRef"]["name"] == "lr-sweep-sweep-checkpoint-key"


def test_the_second_trial_finds_the_sweeps_key_made_by_the_first_and_starts(tmp_path: Path) -> None:
    fake = KeyCluster(trial_body(tmp_path), existing=["sweep-uid"])
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]


def test_a_run_labelled_with_a_sweep_that_does_not_own_it_keeps_a_key_of_its_own(tmp_path: Path) -> None:
    """A label anyone may set does not give a run a sweep's key: the sweep must be its controller owner."""
    run = parse_training_run(trial_body(tmp_path, sweep_uid=None))
    assert run.sweep is None
    assert run.checkpoint_key_secret == "r-checkpoint-key"
    fake = KeyCluster(trial_body(tmp_path, sweep_uid=None), existing=["sweep-uid"])
    fake.reconcile(fake.config(**KEYED))
    assert "Secret ns/r-checkpoint-key exists and is not this run's" in fake.run["status"]["message"]
