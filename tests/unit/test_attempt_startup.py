"""Where an attempt's start-up went, in its status entry (issue 39, item 3: controller/startup.py).

The pure part from made-up pods; then the controller's reconcile over a fake API server and a real
directory store: the milestones land in status.attempts[].startup once the first step is known,
and the attempt's pods are listed once for it, not on every reconcile.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotray.cli.run_status import describe_run
from spotray.contract.attempts import AttemptId
from spotray.contract.status import AttemptStartup, format_date_time, parse_timestamp
from spotray.contract.uris import parse_uri
from spotray.controller.config import ControllerConfig
from spotray.controller.reconcile import reconcile
from spotray.controller.startup import attempt_startup, pods_ready_at
from spotray.train.records.progress_log import AttemptProgress
from spotray.train.storage.store import LocalObjectStore
from tests.unit.test_controller_writes import FakeCluster, new_run

pytestmark = pytest.mark.unit
START = datetime(2026, 11, 28, 9, 0, 0, tzinfo=UTC)


def pod(
    name: str, ready_after_s: float | None, node_type: str | None = "worker", start: datetime = START
) -> dict[str, Any]:
    labels = {"spotray.dev/run": "burst"} | ({"ray.io/node-type": node_type} if node_type else {})
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": format_date_time(start)}]
    if ready_after_s is not None:
        moment = start + timedelta(seconds=ready_after_s)
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": format_date_time(moment)})
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conditions}}


def test_the_pods_are_ready_when_the_last_ray_pod_is_and_the_submitter_does_not_count() -> None:
    pods = [pod("head", 11, "head"), pod("worker", 18), pod("submitter", 40, node_type=None)]
    assert pods_ready_at(pods) == START + timedelta(seconds=18)
    assert pods_ready_at([pod("head", 11, "head"), pod("worker", None)]) is None, "a worker not Ready yet"
    assert pods_ready_at([pod("submitter", 3, node_type=None)]) is None, "no Ray pod at all"


def test_milestones_are_seconds_after_the_rayjob_and_never_before_it() -> None:
    startup = attempt_startup(
        format_date_time(START),
        pods_ready=START + timedelta(seconds=18),
        training_loop_at=(START + timedelta(seconds=50.04)).timestamp(),
        first_step_at=(START - timedelta(seconds=2)).timestamp(),  # a job's clock behind the controller's
    )
    assert startup == AttemptStartup(pods_ready=18.0, training_loop=50.0, first_step=0.0)
    assert attempt_startup(None, pods_ready=None, training_loop_at=None, first_step_at=None) is None


class PodsCluster(FakeCluster):
    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__(run)
        self.pod_lists = 0

    def list_attempt_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        self.pod_lists += 1
        assert labels == {"spotray.dev/run": "burst", "spotray.dev/attempt": "1"}
        return super().list_attempt_pods(namespace, labels)


def write_progress(store: LocalObjectStore, uid: str, started: datetime, steps: int) -> None:
    begun = started + timedelta(seconds=50)
    points = [(step, 1.0, (begun + timedelta(seconds=step)).timestamp()) for step in range(1, steps + 1)]
    progress = AttemptProgress(1, uid, max_steps=100, started=begun.timestamp(), points=points)
    store.put_bytes(AttemptId(uid, 1).progress_key, progress.to_json())


def test_reconcile_records_the_start_up_once_the_first_step_is_known_reading_the_pods_once(tmp_path: Path) -> None:
    uid = "uid-startup"
    body = new_run(uid)
    body["spec"]["checkpoint"]["uri"] = f"file://{tmp_path / 'runs' / 'burst'}"
    fake = PodsCluster(body)
    cluster: Any = fake
    config = ControllerConfig(file_roots=(str(tmp_path / "runs"),))
    reconcile(cluster, config, "ns", "burst")
    fake.rayjobs["burst-a1"]["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
    started = parse_timestamp(fake.run["status"]["attempts"][0]["startTime"])
    assert started is not None
    fake.pods = (
        pod("burst-a1-head", 11, "head", started),
        pod("burst-a1-workers-x", 18, "worker", started),
        pod("burst-a1-submitter", 20, None, started),
    )
    store = LocalObjectStore(parse_uri(body["spec"]["checkpoint"]["uri"]))
    reconcile(cluster, config, "ns", "burst")  # training has not begun: nothing to record yet
    assert "startup" not in fake.run["status"]["attempts"][0]
    assert fake.pod_lists == 0

    write_progress(store, uid, started, steps=3)
    reconcile(cluster, config, "ns", "burst")
    assert fake.run["status"]["attempts"][0]["startup"] == {"podsReady": 18.0, "trainingLoop": 50.0, "firstStep": 51.0}
    write_progress(store, uid, started, steps=9)
    reconcile(cluster, config, "ns", "burst")
    assert fake.run["status"]["attempts"][0]["startup"]["firstStep"] == 51.0
    assert fake.pod_lists == 1, "the attempt's pods are read once, for its start-up"


def test_spotray_status_shows_each_attempts_start_up() -> None:
    startup = {"podsReady": 18.0, "trainingLoop": 50.0, "firstStep": 51.0}
    attempts = [
        {
            "attempt": 1,
            "rayJob": "burst-a1",
            "outcome": "Preempted",
            "startTime": format_date_time(START),
            "startup": startup,
        },
        {"attempt": 2, "rayJob": "burst-a2", "outcome": "Running", "startTime": format_date_time(START)},
    ]
    body = new_run("uid") | {"status": {"phase": "Running", "attempt": 2, "attempts": attempts}}
    text = describe_run(body, now=START)
    assert "START-UP" in text
    assert "pods 18s, loop 50s, step 51s" in text
