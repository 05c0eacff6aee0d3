"""make release: build and check what a release publishes; push it only when told where.

    python hack/release.py                          # dist/<version>/{python,chart}/: all checked
    python hack/release.py --registry ghcr.io/ORG   # the same, then push the chart (OCI) and the images
    python hack/release.py --images                 # also build the images (docker or podman)

Steps, each stopping the release with the fix when it fails:
1. one version everywhere: pyproject.toml, the chart's version and appVersion, a CHANGELOG section
   for it (``--snapshot`` skips the CHANGELOG check, for a build between releases);
2. the wheel and the sdist (uv build), checked with ``twine check --strict``;
3. the chart, linted and packaged (helm), with the CRDs it carries;
4. with ``--images`` or ``--registry``: the images of docs/releasing.md, built from the Dockerfile;
5. with ``--registry``: ``helm push`` of the chart to ``oci://REGISTRY/charts`` and a push of each image.
Nothing is uploaded to PyPI here: the CI workflow (.github/workflows/release.yml) does that from
the checked files, with the project's trusted publisher, when a ``v<version>`` tag is pushed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "spotray"
# make release passes both: uv from make setup, helm from the test bed (testbed/build.sh builds it).
UV = os.environ.get("UV", "uv")
HELM = os.environ.get("HELM", "helm")


class ReleaseError(Exception):
    """A step failed: the message says what, and how to fix it."""


@dataclass(frozen=True)
class Image:
    """One image a release publishes: its name suffix and the build arguments that make it."""

    suffix: str  # appended to the version tag: "" (CPU), "-cuda", "-controller"
    build_args: tuple[str, ...]
    why: str
    target: str = ""  # a Dockerfile stage; "": the last one


IMAGES = (
    Image("", (), "CPU PyTorch: CPU nodes, kind"),
    Image(
        "-cuda",
        (
            "TORCH_INDEX=https://pypi.org/simple",
            "TORCH_CUDA_LOCK=docker/requirements-torch-pypi.lock",
        ),
        "CUDA PyTorch from PyPI, for GPU nodes",
    ),
    Image("-controller", (), "the controller alone: no torch, no Ray (the chart's controller.image)", "controller"),
)


def versions() -> dict[str, str]:
    """Every place that states the version, by where."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return {
        "pyproject.toml": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"],
        "charts/spotray/Chart.yaml version": str(chart["version"]),
        "charts/spotray/Chart.yaml appVersion": str(chart["appVersion"]),
    }


def changelog_versions() -> list[str]:
    """The released versions CHANGELOG.md has a section for, newest first."""
    return re.findall(r"^## (\d+\.\d+\.\d+\S*)", (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)


def check_versions(snapshot: bool) -> str:
    found = versions()
    if len(set(found.values())) != 1:
        listed = ", ".join(f"{where}: {v}" for where, v in found.items())
        raise ReleaseError(f"the version differs between files ({listed})", "set the same version in each")
    (version,) = set(found.values())
    if not snapshot and version not in changelog_versions():
        raise ReleaseError(
            f"CHANGELOG.md has no section for {version}",
            f"move its 'Unreleased' notes under '## {version} (date)', or pass --snapshot for a build between releases",
        )
    return version


def run(*command: str) -> str:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(command[:3])} failed:\n{result.stdout}{result.stderr}", "see the output above")
    return result.stdout


def tool(command: str) -> str:
    found = shutil.which(command)
    if found is None:
        raise ReleaseError(f"{command} was not found", "install it, or run `make release` (it passes uv and helm)")
    return found


def helm() -> str:
    return tool(HELM)


def build_python(out: Path) -> list[Path]:
    out.mkdir()
    run(tool(UV), "build", "--out-dir", str(out), str(ROOT))
    built = sorted(out.glob("spotray-*"))
    run(sys.executable, "-m", "twine", "check", "--strict", *map(str, built))
    return built


def build_chart(out: Path) -> Path:
    out.mkdir()
    binary = helm()
    run(binary, "lint", str(CHART), "--strict", "--set", "image.repository=registry.example.com/spotray")
    run(binary, "package", str(CHART), "--destination", str(out))
    (package,) = out.glob("spotray-*.tgz")
    return package


def image_tool() -> str:
    for name in ("docker", "podman"):
        if shutil.which(name):
            return name
    raise ReleaseError("neither docker nor podman is on PATH", "build the images where one is (CI does)")


def build_images(version: str, repository: str) -> list[str]:
    builder = image_tool()
    tags = []
    for image in IMAGES:
        tag = f"{repository}:{version}{image.suffix}"
        args = [a for build_arg in image.build_args for a in ("--build-arg", build_arg)]
        if image.target:
            args += ["--target", image.target]
        run(builder, "build", *args, "-t", tag, str(ROOT))
        tags.append(tag)
    return tags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", help="push the chart and the images there, e.g. ghcr.io/ORG")
    parser.add_argument("--images", action="store_true", help="build the images (docker or podman)")
    parser.add_argument("--snapshot", action="store_true", help="a build between releases: no CHANGELOG section")
    parser.add_argument("--out", type=Path, default=None, help="where the files go (default: dist/<version>)")
    args = parser.parse_args()
    try:
        version = check_versions(args.snapshot)
        out = args.out or ROOT / "dist" / version
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        files = [*build_python(out / "python"), build_chart(out / "chart")]
        repository = f"{args.registry}/spotray" if args.registry else "spotray/spotray"
        images = build_images(version, repository) if args.images or args.registry else []
        if args.registry:
            run(helm(), "push", str(files[-1]), f"oci://{args.registry}/charts")
            for tag in images:
                run(image_tool(), "push", tag)
    except ReleaseError as error:
        problem, fix = error.args
        print(f"release: {problem}\n  fix: {fix}", file=sys.stderr)
        return 1
    print(f"release {version}: checked")
    for path in files:
        print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    for tag in images:
        print(f"  image {tag}{' (pushed)' if args.registry else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
