"""`python -m build` makes a wheel and an sdist that hold the library and nothing else, and twine accepts them.

Installing the wheel and running it is `make test-compat`'s part: every compat venv installs this
wheel, and its tests run `spotray --help` and the README's own script against it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True, capture_output=True)
    return out


def test_the_wheel_holds_the_spotray_package_only(dist: Path) -> None:
    (wheel,) = dist.glob("spotray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("spotray/", "spotray-")) for n in names), [n for n in names if not n.startswith("spotray")]
    for module in ("spotray/cli/main.py", "spotray/train/hf/callback.py", "spotray/controller/handlers.py"):
        assert module in names
    assert "spotray/jobs/gpt2/train.py" in names  # the example jobs: `python -m spotray.jobs.gpt2` in the image
    assert "spotray/py.typed" in names
    payload = [n for n in names if not n.startswith("spotray-0")]
    assert all(n.endswith(".py") or n == "spotray/py.typed" for n in payload), "no data, manifests or tests"


def test_the_sdist_holds_each_file_once_and_no_tests_or_benchmarks(dist: Path) -> None:
    (sdist,) = dist.glob("spotray-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = archive.getmembers()
    top = {Path(m.name).parts[1] for m in members if len(Path(m.name).parts) > 1}
    assert top <= {
        "spotray", "spotray.egg-info", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "PKG-INFO", "setup.cfg"
    }  # fmt: skip
    assert "LICENSE" in top
    assert not [m.name for m in members if m.issym()], "the symlinked folders are stored as real files"


def _project_name(requirement: str) -> str:
    """`transformers<6,>=4.52; extra == "train"` -> `transformers` (the builder may order the bounds either way)."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_metadata_names_the_pythons_the_ranges_and_the_extras(dist: Path) -> None:
    (wheel,) = dist.glob("spotray-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    assert metadata["Requires-Python"] == ">=3.11"
    assert {"train", "ray", "streaming", "controller", "plot", "all"} <= set(metadata.get_all("Provides-Extra"))
    requires = metadata.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if "==" in r], f"the core dependencies are ranges, not pins: {core}"
    # Light: `pip install spotray` is the CLI and the contract, no torch (issue 72).
    assert {_project_name(r) for r in core} == {"boto3", "pyyaml", "kubernetes"}
    train = {_project_name(r) for r in requires if 'extra == "train"' in r}
    assert train == {"torch", "transformers", "accelerate"}, train
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Source" in " ".join(metadata.get_all("Project-URL"))


def test_twine_accepts_both(dist: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_make_release_builds_checked_artifacts_and_refuses_an_unnamed_version(tmp_path: Path) -> None:
    """hack/release.py (make release) between releases: the wheel, the sdist and the chart, each checked."""
    import os  # noqa: PLC0415

    from testbed.cluster import binary  # noqa: PLC0415

    uv = Path.home() / ".cache/spotray/tools/uv-0.13.9/bin/uv"
    env = {**os.environ, "UV": str(uv), "HELM": str(binary("helm"))}
    command = [sys.executable, str(ROOT / "hack" / "release.py"), "--out", str(tmp_path / "out")]
    snapshot = subprocess.run([*command, "--snapshot"], env=env, capture_output=True, text=True, check=False)
    assert snapshot.returncode == 0, snapshot.stdout + snapshot.stderr
    built = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("spotray-*"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert built == [
        f"chart/spotray-{version}.tgz",
        f"python/spotray-{version}-py3-none-any.whl",
        f"python/spotray-{version}.tar.gz",
    ]
    released = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if f"## {version}" not in (ROOT / "CHANGELOG.md").read_text():
        assert released.returncode == 1
        assert f"CHANGELOG.md has no section for {version}" in released.stderr
