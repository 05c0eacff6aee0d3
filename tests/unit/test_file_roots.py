"""file:// checkpoint URIs in the controller: read only inside the directories its operator lists.

A TrainingRun's ``checkpoint.uri`` may be a directory (``file:///mnt/shared/runs/x``) that its job
writes on a volume the Ray pods share. The controller reads the same path on its own file system,
so ``checkpoint.uri: /`` made it list its whole root file system at every refresh (issue 38). It
now reads a file:// URI only strictly inside a directory of ``SPOTRAY_FILE_ROOTS`` (the chart's
``controller.fileRoots``; empty by default: no file:// run is read in a cluster), symbolic links
and ``..`` resolved, and refuses any other with a message that names the setting. Local mode
(spotray/local/local_run.py) opens the user's own directories with train/storage's ``open_store`` and keeps
accepting every file:// URI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import TrainingRun, parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.run_store import open_run_store, store_config
from spotray.train.records.progress_log import AttemptProgress
from spotray.train.storage.store import LocalObjectStore, open_store
from tests.unit.test_status_unreadable import FakeCluster, attempt, body

pytestmark = pytest.mark.unit


class NoSecrets:
    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> None:
        raise AssertionError("a run with no Secret reads none")


def run(uri: str) -> TrainingRun:
    document = {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r", "namespace": "ml"},
        "spec": {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": {"uri": uri}},
    }
    return parse_training_run(document)


def reach(uri: str, roots: tuple[str, ...] = ()) -> object:
    return store_config(run(uri), NoSecrets(), ControllerConfig(file_roots=roots))  # type: ignore[arg-type]


def test_the_roots_come_from_the_environment_as_absolute_directories() -> None:
    config = ControllerConfig.from_env({"SPOTRAY_FILE_ROOTS": " /mnt/shared/ , /data/runs/../teams"})
    assert config.file_roots == ("/mnt/shared", "/data/teams")
    assert ControllerConfig.from_env({}).file_roots == ()


@pytest.mark.parametrize("roots", ["/", "//", "/mnt/shared,/", "mnt/shared", "/mnt/../.."])
def test_the_whole_file_system_or_a_relative_path_is_no_root(roots: str) -> None:
    with pytest.raises(SpotrayError, match="SPOTRAY_FILE_ROOTS"):
        ControllerConfig.from_env({"SPOTRAY_FILE_ROOTS": roots})


@pytest.mark.parametrize("uri", ["/", "file:///", "file:///mnt/shared/runs/r", "/etc"])
def test_with_no_roots_listed_every_file_uri_is_refused_naming_the_setting(uri: str) -> None:
    with pytest.raises(SpotrayError) as caught:
        reach(uri)
    assert "SPOTRAY_FILE_ROOTS" in caught.value.problem
    assert "controller.fileRoots" in caught.value.problem
    assert "s3://" in caught.value.fix  # the other way out


def test_checkpoint_uri_slash_never_makes_the_controller_list_its_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def listed(self: LocalObjectStore, prefix: str = "") -> list[Any]:
        raise AssertionError(f"the controller listed {self.root}")

    monkeypatch.setattr(LocalObjectStore, "list", listed)
    for roots in [(), (str(tmp_path),)]:
        with pytest.raises(SpotrayError, match="not inside a directory the controller may read"):
            open_run_store(run("/"), NoSecrets(), ControllerConfig(file_roots=roots))  # type: ignore[arg-type]


def test_a_directory_inside_a_root_is_read(tmp_path: Path) -> None:
    roots = (str(tmp_path / "shared"),)
    (tmp_path / "shared" / "team").mkdir(parents=True)
    (tmp_path / "shared" / "runs").symlink_to(tmp_path / "shared" / "team")  # a link that stays inside
    for uri in [f"file://{tmp_path}/shared/runs/r", f"{tmp_path}/shared/team/r/", f"{tmp_path}/shared/not-yet/r"]:
        assert reach(uri, roots) is not None


@pytest.mark.parametrize(
    "where",
    [
        "shared",  # the root itself: every run's directory at once
        "shared/../elsewhere/r",
        "shared-too/r",  # a sibling whose name starts like the root's
        "shared/escape/r",  # a link the run's pods could make on the shared volume, to a directory outside
        "elsewhere",
    ],
)
def test_a_directory_outside_the_roots_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "shared" / "escape").symlink_to("/")
    with pytest.raises(SpotrayError) as caught:
        reach(f"file://{tmp_path}/{where}", (str(tmp_path / "shared"),))
    assert f"{tmp_path}/shared" in caught.value.problem  # what is allowed


def test_a_run_outside_the_roots_fails_at_once_naming_the_setting_and_nothing_is_read(tmp_path: Path) -> None:
    """The controller could never read its records (it would judge its attempts blind, or wait for
    ever): bad input, refused once, before any RayJob; inside the roots the same run is read."""
    store = open_store(str(tmp_path / "ckpt"))
    status = {"phase": "Running", "attempt": 1, "rayJob": "r-a1", "attempts": [attempt(1, "Running")]}
    fake = FakeCluster(body(tmp_path, status))
    uid = fake.run["metadata"]["uid"]
    progress = AttemptProgress(attempt=1, run_id=uid, points=[(7, 1.5, 100.0)], updated=100.0)
    store.put_bytes(AttemptId(uid, 1).progress_key, progress.to_json())
    fake.add_rayjob(1, "RUNNING", "Running")

    fake.reconcile(ControllerConfig(file_roots=(str(tmp_path),)))
    assert fake.run["status"]["progress"]["step"] == 7
    assert fake.run["status"]["message"] == "attempt 1 running"

    elsewhere = FakeCluster(body(tmp_path, {}))
    elsewhere.reconcile(ControllerConfig())
    refused = elsewhere.run["status"]
    assert refused["phase"] == "Failed"
    assert "spec.checkpoint.uri: spec.checkpoint.uri file://" in refused["message"]
    assert "SPOTRAY_FILE_ROOTS" in refused["message"]
    assert "controller.fileRoots" in refused["message"]
    assert elsewhere.created == [], "no RayJob for a run the controller cannot follow"
