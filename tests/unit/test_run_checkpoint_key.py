"""controller/checkpoint_key_secret.py: the namespace's checkpoint key, made once, given to pods by reference.

Issue #38, item 4, and issue #69, item 1. The key's use (signing, refusing forged checkpoints) is
tests/unit/test_checkpoint_key.py; here the controller's part: the Secret made before a run's first
RayJob when it is not there yet, and never again; owned by nothing (it outlives runs, as their
checkpoints do), immutable; every Ray container referencing it (optional, so a run without one goes
on); a Secret of that name already there taken as the key, whoever made it; the API server's refusal.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, CheckpointKey
from spotray.contract.names import API_VERSION, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.spec import parse_training_run
from spotray.contract.uris import parse_uri
from spotray.controller import reconcile
from spotray.controller.checkpoint_key_secret import build_checkpoint_key_secret, new_checkpoint_key
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


def test_the_key_secret_is_the_namespaces_owned_by_nothing_immutable_with_a_fresh_random_key(tmp_path: Path) -> None:
    run = parse_training_run(body(tmp_path, None))
    key = new_checkpoint_key()
    secret = build_checkpoint_key_secret(run, key)
    assert (secret["metadata"]["namespace"], secret["metadata"]["name"]) == ("ns", "spotray-checkpoint-key")
    assert "ownerReferences" not in secret["metadata"]  # deleting the run leaves it, as it leaves the checkpoints
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
        assert item["valueFrom"]["secretKeyRef"] == {"name": "spotray-checkpoint-key", "key": "key", "optional": True}
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

    def create_checkpoint_key_secret(self, secret: dict[str, Any]) -> None:
        self.calls.append("secret")
        # The real Cluster's handling of the API server's answers, over this fake's "server".
        real = Cluster.__new__(Cluster)
        real.core = self  # type: ignore[assignment]
        Cluster.create_checkpoint_key_secret(real, secret)

    def create_namespaced_secret(self, namespace: str, secret: dict[str, Any], **_: Any) -> None:
        if self.refuse is not None:
            error = ApiException(status=self.refuse, reason="Forbidden")
            error.body = '{"reason": "Forbidden", "message": "secrets is forbidden: cannot create"}'
            raise error
        if self.existing is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.secrets.append(secret)

    def create_rayjob(self, rayjob: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("rayjob")
        return super().create_rayjob(rayjob)


def test_the_key_is_made_before_the_runs_first_rayjob(tmp_path: Path) -> None:
    fake = KeyCluster(body(tmp_path, None))
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]
    assert fake.secrets[0]["metadata"]["name"] == "spotray-checkpoint-key"


def test_no_later_attempt_makes_a_key_so_a_run_never_changes_keys(tmp_path: Path) -> None:
    """A new key would refuse every checkpoint the run has: a run whose key is gone (or that began
    before keys) goes on without one, its pods' reference being optional."""
    fake = KeyCluster(body(tmp_path, None))
    run, uid = parse_training_run(fake.run), fake.run["metadata"]["uid"]
    config = ControllerConfig(**KEYED)  # type: ignore[arg-type]
    reconcile._create(fake, run, uid, config, build_rayjob(run, 2, uid, config), attempt=2)  # type: ignore[arg-type]
    assert fake.calls == ["rayjob"]


@pytest.mark.parametrize(
    "owners", [[], ["uid-of-a-deleted-run"], ["uid-of-something-else"]], ids=["user-made", "runs-before", "owned"]
)
def test_a_key_secret_already_there_is_the_key_whoever_made_it(tmp_path: Path, owners: list[str]) -> None:
    """Issue #69: a run deleted and created again (a new UID) finds the key its checkpoints were signed
    with, and resumes from them; so does any run of the namespace. The Secret is neither read nor replaced."""
    fake = KeyCluster(body(tmp_path, None), existing=owners)
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]
    assert fake.secrets == [], "not replaced"


def test_a_run_created_again_gets_the_same_key_secret_as_the_run_before_it(tmp_path: Path) -> None:
    first, again = body(tmp_path, None), body(tmp_path, None)
    again["metadata"]["uid"] = "another-uid"
    config = ControllerConfig(**KEYED)  # type: ignore[arg-type]
    made = [
        build_checkpoint_key_secret(parse_training_run(run), new_checkpoint_key())["metadata"] for run in (first, again)
    ]
    assert made[0] == made[1]
    for run in (first, again):
        rayjob = build_rayjob(parse_training_run(run), 1, run["metadata"]["uid"], config)
        names = {
            e["valueFrom"]["secretKeyRef"]["name"]
            for c in ray_containers(rayjob)
            for e in c["env"]
            if e["name"] == CHECKPOINT_KEY_ENV
        }
        assert names == {"spotray-checkpoint-key"}


def test_spec_checkpoint_key_secret_names_another(tmp_path: Path) -> None:
    run_body = body(tmp_path, None)
    run_body["spec"]["checkpoint"]["keySecret"] = "team-a-checkpoint-key"
    run = parse_training_run(run_body)
    assert run.checkpoint_key_secret == "team-a-checkpoint-key"
    assert build_checkpoint_key_secret(run, new_checkpoint_key())["metadata"]["name"] == "team-a-checkpoint-key"
    rayjob = build_rayjob(run, 1, "uid-1", ControllerConfig(**KEYED))  # type: ignore[arg-type]
    for container in ray_containers(rayjob):
        [item] = [e for e in container["env"] if e["name"] == CHECKPOINT_KEY_ENV]
        assert item["valueFrom"]["secretKeyRef"]["name"] == "team-a-checkpoint-key"


def test_a_key_secret_the_api_server_refuses_holds_the_rayjob_back(tmp_path: Path) -> None:
    fake = KeyCluster(body(tmp_path, None), refuse=403)
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret"]
    assert fake.rayjobs == {}
    assert "Secret spotray-checkpoint-key: secrets is forbidden" in fake.run["status"]["message"]


def test_the_setting_comes_from_the_chart_and_the_shared_ray_cluster_gets_no_key(tmp_path: Path) -> None:
    assert ControllerConfig.from_env({"SPOTRAY_RUN_CHECKPOINT_KEYS": "true"}).run_checkpoint_keys
    assert not ControllerConfig.from_env({}).run_checkpoint_keys
    fake = KeyCluster(body(tmp_path, None))
    fake.reconcile(fake.config(**KEYED, ray_cluster_selector={"ray.io/cluster": "shared"}))
    assert fake.calls == ["rayjob"]


def test_the_fakes_stand_in_for_calls_the_kubernetes_client_has() -> None:
    """The fakes above answer the calls controller/kube.py makes; these are the client's own (a
    call_api with another client version's arguments passed every unit test and failed on real pods)."""
    from kubernetes import client  # noqa: PLC0415

    for api, method in [
        (client.CoreV1Api, "create_namespaced_secret"),
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
        assert (namespace, name) == ("ns", "spotray-checkpoint-key")
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
    assert "cannot read the run's checkpoint key, Secret ns/spotray-checkpoint-key: 500" in json.dumps(status), status


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


def test_a_sweeps_trials_share_the_namespaces_key(tmp_path: Path) -> None:
    """Population-based training resumes a trial from another trial's checkpoint: its job must be able to
    check that checkpoint's manifest, so every trial signs and checks with the same key, the namespace's."""
    run = parse_training_run(trial_body(tmp_path))
    assert run.sweep is not None
    secret = build_checkpoint_key_secret(run, new_checkpoint_key())
    assert secret["metadata"]["name"] == "spotray-checkpoint-key"
    rayjob = build_rayjob(run, 1, "trial-uid", ControllerConfig(**KEYED))  # type: ignore[arg-type]
    for container in ray_containers(rayjob):
        [item] = [e for e in container["env"] if e["name"] == CHECKPOINT_KEY_ENV]
        assert item["valueFrom"]["secretKeyRef"]["name"] == "spotray-checkpoint-key"


def test_the_second_trial_finds_the_key_made_by_the_first_and_starts(tmp_path: Path) -> None:
    fake = KeyCluster(trial_body(tmp_path), existing=["sweep-uid"])
    fake.reconcile(fake.config(**KEYED))
    assert fake.calls == ["secret", "rayjob"]
