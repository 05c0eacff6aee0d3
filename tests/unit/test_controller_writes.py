"""What the controller reads and writes, and how often: status patches only on a change, each Event once,
Secrets read once a minute at most, S3 read in full only when an attempt moved (controller/*.py)."""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.status import RunStatus
from spotray.contract.uris import parse_uri
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.kube_events import EventPoster
from spotray.controller.reconcile import MEMORY, reconcile, settled, status_changed
from spotray.controller.run_store import StoreReport, StoreReports
from spotray.decisions.observation import RayJobView
from spotray.decisions.vocabulary import Event
from spotray.train.checkpoints.checkpoint import upload_checkpoint
from spotray.train.records.progress_log import AttemptProgress
from spotray.train.storage.store import LocalObjectStore, ObjectInfo
from tests.conftest import write_files
from tests.lifecycle_runs import LeftoverFacts

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 23, tzinfo=UTC)


@pytest.fixture
def local_checkpoint_dir(tmp_path: Path) -> Path:
    return write_files(tmp_path / "local", {"model.safetensors": b"m" * 100})


def test_a_status_is_changed_only_by_a_field_that_differs() -> None:
    old = {"phase": "Pending", "attempts": [{"attempt": 1}], "progress": {"step": 5}}
    assert not status_changed(old, {"phase": "Pending", "attempts": [{"attempt": 1}]})
    assert not status_changed(old, {"phase": "Pending", "nextAttemptTime": None})  # null: absent either way
    assert status_changed(old, {"phase": "Running"})
    assert status_changed(old, {"attempts": [{"attempt": 1}, {"attempt": 2}]})
    assert status_changed(old, {"progress": None})  # a merge patch would remove it


class Posts:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, run: dict[str, Any], event: Event, now: datetime) -> None:
        with self.lock:
            self.posted.append((run["metadata"]["uid"], event.reason))


def run_body(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid}}


def test_the_same_event_on_the_same_run_is_posted_once_per_repeat_interval() -> None:
    posts, poster = Posts(), EventPoster(repeat_after_s=3600)
    waiting = Event("Warning", "SecretMissing", "Secret s3 is missing")
    for _ in range(50):  # a reconcile every interval while the Secret stays missing
        poster.post(posts, run_body("a"), waiting, NOW)
    poster.post(posts, run_body("b"), waiting, NOW)  # another run: its own event
    poster.post(posts, run_body("a"), Event("Normal", "AttemptStarted", "attempt 1"), NOW)
    poster.drain()
    assert posts.posted == [("a", "SecretMissing"), ("b", "SecretMissing"), ("a", "AttemptStarted")]
    assert poster.skipped == 49


def test_an_event_is_posted_again_after_the_repeat_interval_and_memory_is_bounded() -> None:
    posts, poster = Posts(), EventPoster(repeat_after_s=0.0, remembered=3)
    for index in range(10):
        poster.post(posts, run_body(f"run-{index}"), Event("Normal", "R", "m"), NOW)
        poster.post(posts, run_body(f"run-{index}"), Event("Normal", "R", "m"), NOW)
    poster.drain()
    assert len(posts.posted) == 20
    assert len(poster._posted) == 3


@pytest.mark.parametrize(
    ("deployment", "job", "submitted"),
    [
        (None, None, False),
        ("Initializing", None, False),  # the Ray cluster waits for nodes: nothing can have been written
        ("Initializing", "PENDING", False),
        ("Running", "PENDING", True),
        ("Running", "RUNNING", True),
        ("Complete", "SUCCEEDED", True),
        ("Failed", None, True),  # e.g. the start deadline: the records are read to classify the end
    ],
)
def test_s3_is_read_only_once_the_job_was_handed_to_ray(
    deployment: str | None, job: str | None, submitted: bool
) -> None:
    assert RayJobView(job_status=job, deployment_status=deployment).submitted is submitted


class SecretsApi:
    def __init__(self) -> None:
        self.reads = 0
        self.exists = True

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        self.reads += 1
        if not self.exists:
            raise ApiException(status=404)
        data = {"AWS_ACCESS_KEY_ID": base64.b64encode(b"key").decode()}
        return SimpleNamespace(data=data, metadata=SimpleNamespace(labels={"spotray.dev/s3-credentials": "true"}))


def test_a_secret_read_within_max_age_is_not_read_again_and_a_missing_one_is_never_remembered() -> None:
    cluster = Cluster(api_client=None)  # type: ignore[arg-type] # the client's default; no call is made
    api = SecretsApi()
    cluster.core = api  # type: ignore[assignment]
    first = cluster.read_secret("ns", "s3", max_age_s=60)
    assert first is not None
    assert first.data == {"AWS_ACCESS_KEY_ID": "key"}
    assert cluster.read_secret("ns", "s3", max_age_s=60) == first
    assert api.reads == 1
    assert cluster.read_secret("ns", "s3") == first  # no max age: read now
    assert api.reads == 2
    api.exists = False
    assert cluster.read_secret("ns", "s3", max_age_s=0) is None
    api.exists = True
    cluster.read_secret("ns", "s3", max_age_s=60)
    assert api.reads == 4  # the miss was not remembered, so the Secret created since is read


class CountingStore(LocalObjectStore):
    """A directory store that counts the requests an S3 store would make."""

    def __init__(self, root: Path) -> None:
        super().__init__(parse_uri(str(root)))
        self.requests: Counter[str] = Counter()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self.requests["list"] += 1
        return super().list(prefix)

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        self.requests["get"] += 1
        return super().get_bytes(key, max_bytes=max_bytes)


def write_progress(store: LocalObjectStore, attempt: AttemptId, steps: int) -> None:
    points = [(step, 1.0 / step, 1000.0 + step) for step in range(1, steps + 1)]
    progress = AttemptProgress(attempt.attempt, attempt.run_id, max_steps=100, updated=1000.0 + steps, points=points)
    store.put_bytes(attempt.progress_key, progress.to_json())


def steps(report: StoreReport) -> tuple[int | None, int | None]:
    """(status.progress.step, status.lastCheckpoint.step) of a report."""
    return (
        report.progress.step if report.progress else None,
        report.last_checkpoint.step if report.last_checkpoint else None,
    )


def test_a_running_attempt_is_read_in_full_only_when_its_progress_changed(
    tmp_path: Path, local_checkpoint_dir: Path
) -> None:
    store, reports, attempt = CountingStore(tmp_path / "store"), StoreReports(), AttemptId("uid-1", 1)
    upload_checkpoint(store, local_checkpoint_dir, 10, world_size=1)
    write_progress(store, attempt, 12)
    first = reports.read(store, attempt, ended=False)
    assert steps(first) == (12, 10)
    store.requests.clear()
    assert reports.read(store, attempt, ended=False) == first
    assert store.requests == {"list": 1}  # the progress object's ETag only: nothing trained since
    write_progress(store, attempt, 20)
    upload_checkpoint(store, local_checkpoint_dir, 20, world_size=1)
    assert steps(reports.read(store, attempt, ended=False)) == (20, 20)
    upload_checkpoint(store, local_checkpoint_dir, 30, world_size=1)  # the final upload, after the last progress
    assert steps(reports.read(store, attempt, ended=True)) == (20, 30)  # an attempt that ended is read in full
    assert reports.full_reads == 3


def test_a_missing_progress_object_is_looked_for_with_one_list_until_it_appears(tmp_path: Path) -> None:
    store, reports, attempt = CountingStore(tmp_path / "store"), StoreReports(), AttemptId("uid-1", 2)
    assert reports.read(store, attempt, ended=False) == StoreReport(None, None, None)
    store.requests.clear()
    assert reports.read(store, attempt, ended=False) == StoreReport(None, None, None)
    assert store.requests == {"list": 1}
    write_progress(store, attempt, 3)
    found = reports.read(store, attempt, ended=False)
    assert found.progress is not None
    assert found.progress.step == 3


def test_a_remembered_report_is_read_again_after_max_age(tmp_path: Path) -> None:
    store, reports, attempt = CountingStore(tmp_path / "store"), StoreReports(max_age_s=0.0), AttemptId("u", 1)
    write_progress(store, attempt, 5)
    reports.read(store, attempt, ended=False)
    reports.read(store, attempt, ended=False)
    assert reports.full_reads == 2


class FakeCluster(LeftoverFacts):
    """The calls reconcile makes, over dicts: enough to follow one run through a deferred status write.

    (The e2e tests run the same code against the real API server and KubeRay; this one pins what is
    written when, which a real burst cannot do on demand.)
    """

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        self.rayjobs: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return json.loads(json.dumps(self.run))

    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.rayjobs.get(name)

    def create_rayjob(self, body: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(f"create {body['metadata']['name']}")
        name = body["metadata"]["name"]
        if name in self.rayjobs:
            return self.rayjobs[name]
        self.rayjobs[name] = body
        return None

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> bool:
        now = self.run["metadata"].get("resourceVersion")
        if resource_version is not None and resource_version != now:
            self.calls.append(f"patch refused: resourceVersion {resource_version}, the object's {now}")
            return False
        self.calls.append(f"patch {status['phase']} attempt {status['attempt']}")
        merged = {**(self.run.get("status") or {}), **status}
        self.run["status"] = {key: value for key, value in merged.items() if value is not None}
        if now is not None:
            self.run["metadata"]["resourceVersion"] = str(int(now) + 1)
        return True

    def delete_rayjob(self, namespace: str, name: str) -> None:
        self.calls.append(f"delete {name}")
        self.rayjobs.pop(name, None)

    def post_event(self, run: dict[str, Any], event: Event, now: datetime) -> None:
        self.calls.append(f"event {event.reason}")

    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> None:
        return None


def new_run(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "burst", "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": "s3://bkt/runs/burst"}},
    }


def test_under_a_burst_the_rayjob_is_created_first_and_the_status_written_once_after() -> None:
    fake = FakeCluster(new_run("uid-burst-1"))
    cluster: Any = fake
    assert reconcile(cluster, ControllerConfig(), "ns", "burst", fake.get_run("ns", "burst"), defer_status=True) == 0.0
    assert fake.calls == ["create burst-a1"]  # no status patch, no Event yet
    reconcile(cluster, ControllerConfig(), "ns", "burst")  # the queue's follow-up, once no new run waits
    MEMORY.events.drain()
    assert fake.calls == ["create burst-a1", "patch Pending attempt 1", "event AttemptStarted"]
    assert fake.run["status"]["attempts"][0]["rayJob"] == "burst-a1"


def test_a_rayjob_created_before_a_deferred_status_write_is_deleted_if_the_run_was_suspended_meanwhile() -> None:
    fake = FakeCluster(new_run("uid-burst-2"))
    cluster: Any = fake
    reconcile(cluster, ControllerConfig(), "ns", "burst", fake.get_run("ns", "burst"), defer_status=True)
    fake.run["spec"]["suspend"] = True  # before the follow-up wrote anything
    fake.run["metadata"]["generation"] = 2
    reconcile(cluster, ControllerConfig(), "ns", "burst")
    assert fake.calls[:2] == ["create burst-a1", "delete burst-a1"]  # never recorded, so never left running
    assert fake.rayjobs == {}
    assert fake.run["status"]["phase"] == "Suspended"


def started_on_a_directory(tmp_path: Path, uid: str) -> tuple[FakeCluster, ControllerConfig, LocalObjectStore]:
    """Run ``burst`` with its checkpoints in a directory the controller may read, attempt 1 created."""
    body = new_run(uid)
    body["spec"]["checkpoint"]["uri"] = f"file://{tmp_path / 'runs' / 'burst'}"
    fake = FakeCluster(body)
    config = ControllerConfig(file_roots=(str(tmp_path / "runs"),))
    reconcile(fake, config, "ns", "burst")  # type: ignore[arg-type] # the calls reconcile makes
    return fake, config, LocalObjectStore(parse_uri(body["spec"]["checkpoint"]["uri"]))


def test_a_run_that_ends_while_s3_fails_reads_its_last_progress_and_checkpoint_once_s3_answers(
    tmp_path: Path, local_checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nemesis campaign's trials 19 and 21: the RayJob said SUCCEEDED while S3 answered 500, so the
    status ended with the progress and checkpoint of minutes before (step 53 of 60, checkpoint 50), and a
    finished run was never read again. Now it is, until S3 answers; then the final step and checkpoint."""
    fake, config, store = started_on_a_directory(tmp_path, "uid-final")
    cluster: Any = fake
    attempt = AttemptId("uid-final", 1)
    write_progress(store, attempt, 60)
    upload_checkpoint(store, local_checkpoint_dir, 60, world_size=1)
    ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.rayjobs["burst-a1"]["status"] = {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "endTime": ended}

    real_read = StoreReports.read

    def s3_answers_500(*args: Any, **kwargs: Any) -> StoreReport:
        raise OSError("An error occurred (500) when calling the ListObjectsV2 operation")

    monkeypatch.setattr(StoreReports, "read", s3_answers_500)
    again = reconcile(cluster, config, "ns", "burst")
    status = fake.run["status"]
    assert status["phase"] == "Succeeded"
    assert "progress" not in status
    assert "lastCheckpoint" not in status
    assert status["storageUnreachableSince"], "the finished run's last report is owed"
    assert again, "and it comes back for it"
    assert reconcile(cluster, config, "ns", "burst") is not None, "still owed while S3 fails"

    monkeypatch.setattr(StoreReports, "read", real_read)
    assert reconcile(cluster, config, "ns", "burst") is None, "read: nothing more to do"
    status = fake.run["status"]
    assert (status["progress"]["step"], status["lastCheckpoint"]["step"]) == (60, 60)
    assert status["phase"] == "Succeeded"
    assert status.get("storageUnreachableSince") is None
    MEMORY.events.drain()


def test_a_finished_run_stays_on_the_work_queue_while_its_last_report_is_owed() -> None:
    """The work queue drops finished runs (controller/handlers.py tracks with ``settled``): one whose
    last report is owed must stay, or reconcile's request to come back would be dropped with it."""
    assert not settled(RunStatus(phase="Running"))
    assert settled(RunStatus(phase="Succeeded"))
    assert not settled(RunStatus(phase="Succeeded", storage_unreachable_since="2026-11-28T17:21:30Z"))


def write_record_at(store: LocalObjectStore, key: str, attempt: AttemptId, at: float, **fields: Any) -> None:
    """A record as the job writes it (train/records/attempt_records.py), with the time chosen."""
    store.put_bytes(key, json.dumps({**fields, **attempt.identity(), "time": at}).encode())


def test_a_running_rayjob_whose_job_recorded_its_preemption_long_ago_is_ended_and_deleted(tmp_path: Path) -> None:
    """Nemesis trial 39: the job recorded its preemption and its driver never exited. Its records are read
    once its progress stops (never while it trains), and 120 s after the record the attempt ends."""
    fake, config, store = started_on_a_directory(tmp_path, "uid-stuck")
    cluster: Any = fake
    attempt = AttemptId("uid-stuck", 1)
    fake.rayjobs["burst-a1"]["status"] = {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}
    now = datetime.now(UTC).timestamp()
    # Training: progress a second old. The RayJob alone decides, and no record is read (this one
    # could not be there yet, were the job's clock the controller's).
    points = [(step, 1.0, now - 1 - (40 - step)) for step in range(1, 41)]
    progress = AttemptProgress(1, "uid-stuck", max_steps=60, updated=now - 1, points=points)
    store.put_bytes(attempt.progress_key, progress.to_json())
    reconcile(cluster, config, "ns", "burst")  # the status gets its progress
    write_record_at(store, attempt.preemption_key, attempt, now - 200, step=37, seconds_after_notice=13.3)
    reconcile(cluster, config, "ns", "burst")
    assert "delete burst-a1" not in fake.calls
    assert fake.run["status"]["attempts"][0]["outcome"] == "Running"

    # Stopped: progress 200 s old. Read, and 200 s is past the bound.
    stale = AttemptProgress(1, "uid-stuck", max_steps=60, updated=now - 200, points=[(37, 1.0, now - 200)])
    store.put_bytes(attempt.progress_key, stale.to_json())
    reconcile(cluster, config, "ns", "burst")  # reads the stale progress into the status
    reconcile(cluster, config, "ns", "burst")  # the stale status: the records are read
    MEMORY.events.drain()
    assert "delete burst-a1" in fake.calls
    ended = fake.run["status"]["attempts"][0]
    assert (ended["outcome"], ended["reason"]) == ("Preempted", "SpotNotice")
    assert "still unfinished" in ended["message"]


def test_a_status_meant_for_a_deleted_run_never_lands_on_the_run_created_again_under_its_name() -> None:
    """Issue #69, found by the user-actions campaign (trial 2): `kubectl delete` then `kubectl apply` of
    a run while a reconcile of the deleted object was in flight. Its status patch, by name, landed on the
    new object: the new run took the old one's attempt 1 (its start time, its RayJob) for its own, and
    would as well have taken its budgets spent. The patch now names the resourceVersion it was computed
    from; the new object has another, so nothing of the old one is written or done."""
    old = new_run("uid-deleted")
    old["metadata"]["resourceVersion"] = "10"
    fake = FakeCluster(old)
    cluster: Any = fake
    read = fake.get_run("ns", "burst")  # the reconcile of the old object has read it ...
    created_again = new_run("uid-created-again")  # ... the user deletes it and applies the file again
    created_again["metadata"]["resourceVersion"] = "15"
    fake.run = created_again
    assert reconcile(cluster, ControllerConfig(), "ns", "burst", read, defer_status=False) == 0.0
    assert fake.run.get("status") is None, "the new object's status is its own"
    assert [call for call in fake.calls if call.startswith("patch")] == [
        "patch refused: resourceVersion 10, the object's 15"
    ]
    assert not [call for call in fake.calls if call.startswith(("delete", "event"))]
    # Reconciled again from the object as it is now: the RayJob made for the deleted object is not its
    # own, so it waits for the garbage collector, then starts its own attempt 1.
    reconcile(cluster, ControllerConfig(), "ns", "burst", None, defer_status=False)
    assert "belongs to another TrainingRun" in fake.run["status"]["message"]
    del fake.rayjobs["burst-a1"]  # the garbage collector: its owner is gone
    reconcile(cluster, ControllerConfig(), "ns", "burst", None, defer_status=False)
    assert fake.run["status"]["attempt"] == 1
    assert fake.rayjobs["burst-a1"]["metadata"]["ownerReferences"][0]["uid"] == "uid-created-again"
