"""A release's rules (hack/release.py, docs/releasing.md): one version everywhere, a CHANGELOG
section before a tag, and a workflow that publishes only what `make release` checked."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def load_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "hack" / "release.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = load_release()


def test_the_package_and_the_chart_state_one_version() -> None:
    found = release.versions()
    assert len(set(found.values())) == 1, found


def test_a_version_the_changelog_does_not_name_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "changelog_versions", lambda: ["0.0.9"])
    with pytest.raises(release.ReleaseError) as caught:
        release.check_versions(snapshot=False)
    problem, fix = caught.value.args
    assert "CHANGELOG.md has no section for" in problem
    assert "--snapshot" in fix
    assert release.check_versions(snapshot=True) == release.versions()["pyproject.toml"]


def test_files_that_disagree_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "versions", lambda: {"pyproject.toml": "0.2.0", "Chart.yaml version": "0.1.0"})
    with pytest.raises(release.ReleaseError, match=r"pyproject.toml: 0.2.0, Chart.yaml version: 0.1.0"):
        release.check_versions(snapshot=True)


def test_the_changelog_reads_released_sections_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## Unreleased\n\n## 0.2.0 (2027-01-05)\n\n## 0.1.0\n")
    monkeypatch.setattr(release, "ROOT", tmp_path)
    assert release.changelog_versions() == ["0.2.0", "0.1.0"]


def test_the_workflow_runs_on_a_version_tag_and_publishes_what_make_release_checked() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    steps = workflow["jobs"]["release"]["steps"]
    runs = [step.get("run", "") for step in steps]
    assert any("make release REGISTRY=" in run for run in runs)
    assert any('test "${GITHUB_REF_NAME}" = "v${version}"' in run for run in runs)
    publish = next(step for step in steps if str(step.get("uses", "")).startswith("pypa/gh-action-pypi-publish"))
    assert publish["with"]["packages-dir"].endswith("/python")
    assert workflow["jobs"]["release"]["permissions"]["id-token"] == "write"  # trusted publishing, no token
