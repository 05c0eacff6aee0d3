"""The S3 side of the ``spotray`` command, through the real entry point against a real S3 server
(SeaweedFS): checkpoints, pull and plot on checkpoints and progress written by the real code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from PIL import Image

from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, CheckpointKey
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME, upload_checkpoint
from spotray.train.records.progress_log import AttemptProgress, ProgressWriter
from spotray.train.storage.store import ObjectStore, S3ObjectStore
from tests.conftest import write_files

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def spotray(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotray.cli", *args],
        env=env,
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def save_checkpoint(store: ObjectStore, tmp_path: Path, step: int) -> None:
    files = {"model.safetensors": f"weights at {step}".encode() * 100, "optimizer/rank-0.pt": b"adam" * 50}
    upload_checkpoint(store, write_files(tmp_path / f"local-{step}", files), step, world_size=2)


@pytest.fixture
def three_checkpoints(s3_store: ObjectStore, tmp_path: Path) -> ObjectStore:
    """checkpoint-10 and -20 complete; checkpoint-30 cut off before its manifest was written."""
    for step in (10, 20, 30):
        save_checkpoint(s3_store, tmp_path, step)
    s3_store.delete([f"checkpoint-30/{MANIFEST_NAME}"])
    return s3_store


def test_checkpoints_lists_newest_first_with_complete_and_why_not(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str]
) -> None:
    table = spotray("checkpoints", s3_uri, env=s3_env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["STEP", "SIZE", "FILES", "AGE", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == ["30", "20", "10"]
    assert "incomplete: no manifest" in lines[1]
    assert lines[2].endswith("   complete")
    assert " 3 " in lines[2]  # two files and the manifest

    listing = json.loads(spotray("checkpoints", s3_uri, "-o", "json", env=s3_env).stdout)
    assert [(c["step"], c["complete"]) for c in listing] == [(30, False), (20, True), (10, True)]
    assert listing[0]["problem"].startswith("no manifest")
    assert listing[1]["files"] == 3
    assert listing[1]["uri"] == f"{s3_uri}/checkpoint-20"
    assert listing[1]["sizeBytes"] > 2000

    as_yaml = yaml.safe_load(spotray("checkpoints", s3_uri, "-o", "yaml", env=s3_env).stdout)
    assert as_yaml == listing


def test_checkpoints_reads_the_uri_from_a_manifest(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    manifest = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())
    manifest["spec"]["checkpoint"]["uri"] = s3_uri
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = spotray("checkpoints", str(path), "-o", "json", env=s3_env)
    assert result.returncode == 0, result.stderr
    assert [c["step"] for c in json.loads(result.stdout)] == [30, 20, 10]


def test_pull_fetches_the_newest_complete_checkpoint_verified(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    dest = tmp_path / "out" / "model"
    result = spotray("pull", s3_uri, str(dest), env=s3_env)
    assert result.returncode == 0, result.stderr
    assert "pulled checkpoint-20" in result.stdout
    assert (dest / "model.safetensors").read_bytes() == b"weights at 20" * 100
    assert (dest / "optimizer/rank-0.pt").read_bytes() == b"adam" * 50
    assert json.loads((dest / MANIFEST_NAME).read_text())["step"] == 20
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model"]  # no staging left behind

    older = tmp_path / "older"
    assert spotray("pull", s3_uri, "--step", "10", str(older), env=s3_env).returncode == 0
    assert (older / "model.safetensors").read_bytes() == b"weights at 10" * 100


def test_pull_refuses_an_incomplete_checkpoint(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "model"
    result = spotray("pull", s3_uri, "--step", "30", str(dest), env=s3_env)
    assert result.returncode == 1
    assert result.stderr.startswith("error: checkpoint-30 under")
    assert "incomplete: no manifest" in result.stderr
    assert "fix:" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == []


def test_pull_refuses_a_corrupt_checkpoint_and_leaves_no_dir(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    # Same size, different bytes: only the SHA-256 check can tell.
    original = three_checkpoints.get_bytes("checkpoint-20/model.safetensors")
    three_checkpoints.put_bytes("checkpoint-20/model.safetensors", original.replace(b"weights", b"WEIGHTS"))
    out = tmp_path / "out"
    out.mkdir()
    result = spotray("pull", s3_uri, str(out / "model"), env=s3_env)
    assert result.returncode == 1
    assert "is corrupt: checkpoint-20: file model.safetensors does not match its SHA-256" in result.stderr
    assert "--step" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == []  # neither DIR nor the staging directory


def test_pull_missing_step_and_empty_run_are_not_found(
    three_checkpoints: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    missing = spotray("pull", s3_uri, "--step", "99", str(out / "a"), env=s3_env)
    assert missing.returncode == 3
    assert "no checkpoint-99" in missing.stderr
    assert "steps: 30, 20, 10" in missing.stderr
    empty = spotray("pull", f"{s3_uri}-nothing-here", str(out / "b"), env=s3_env)
    assert empty.returncode == 3
    assert "there are no checkpoints under" in empty.stderr
    assert list(out.iterdir()) == []


def test_pull_refuses_a_dir_that_has_files(s3_uri: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = spotray("pull", s3_uri, str(tmp_path), env=s3_env)
    assert result.returncode == 2
    assert "already exists and is not an empty directory" in result.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


def write_progress(store: ObjectStore, attempt: int, resumed_from: int | None, steps: range) -> None:
    progress = AttemptProgress(attempt=attempt, run_id="run-1", resumed_from=resumed_from, max_steps=100, world_size=2)
    writer = ProgressWriter(store, progress, interval_s=3600)
    for step in steps:
        writer.record(step, 5.0 - step / 40)
    writer.close()


def test_plot_joins_every_attempt_and_marks_the_resumes(
    s3_store: ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    write_progress(s3_store, 1, None, range(1, 46))  # preempted at 45, last checkpoint 40
    write_progress(s3_store, 2, 40, range(41, 81))  # preempted at 80, last checkpoint 80
    write_progress(s3_store, 3, 80, range(81, 101))
    png = tmp_path / "plots" / "loss.png"
    result = spotray("plot", s3_uri, "--output", str(png), env=s3_env)
    assert result.returncode == 0, result.stderr
    assert f"wrote {png}: 3 attempt(s), steps 1-100" in result.stdout
    assert "attempt 2 from step 40, attempt 3 from step 80" in result.stdout
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (1320, 550)  # 12 x 5 inches at 110 dpi: the legend sits beside the axes
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colors) > 50  # lines, labels and shading, not a blank canvas


def test_plot_without_progress_is_not_found(s3_uri: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    result = spotray("plot", s3_uri, "--output", str(tmp_path / "loss.png"), env=s3_env)
    assert result.returncode == 3
    assert "no training progress under" in result.stderr
    assert not (tmp_path / "loss.png").exists()


def test_unreachable_s3_is_a_failure_with_the_fix(tmp_path: Path) -> None:
    env = {
        **dict.fromkeys(("PATH", "HOME"), ""),
        "PATH": "/usr/bin:/bin",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "SPOTRAY_S3_MAX_CONCURRENCY": "2",
    }
    result = spotray("checkpoints", "s3://spotray-test/nowhere", env=env)
    assert result.returncode == 1
    assert "could not reach" in result.stderr
    assert "AWS_ENDPOINT_URL" in result.stderr


def test_bad_run_argument_is_bad_input(tmp_path: Path) -> None:
    result = spotray("checkpoints", "Not_A_Run!", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "is not a manifest file, a checkpoint URI or a TrainingRun name" in result.stderr
    missing = spotray("checkpoints", str(tmp_path / "nope.yaml"), env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 3


def test_submit_refuses_a_bad_manifest_before_touching_a_cluster(tmp_path: Path) -> None:
    manifest = yaml.safe_load((REPO / "jobs/gpt2/trainingrun.yaml").read_text())
    manifest["spec"]["workers"]["replicas"] = 0
    manifest["spec"]["checkpoint"]["uri"] = "s3://Bad_Bucket/x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(manifest))
    # No kube config at all: the manifest must be refused before one is even looked for.
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    for command in (["submit", str(path)], ["run", str(path)]):
        result = spotray(*command, env=env)
        assert result.returncode == 2, result.stderr
        assert f"error: {path} is not valid:" in result.stderr
        assert "spec.workers.replicas: must be >= 1" in result.stderr
        assert "spec.checkpoint.uri:" in result.stderr
        assert "kube config" not in result.stderr


def test_cluster_command_without_kube_config_says_how_to_point_at_one(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    result = spotray("status", env=env)
    assert result.returncode == 2
    assert "no usable kube config" in result.stderr
    assert "--kubeconfig" in result.stderr


def test_help_documents_exit_codes_and_every_command_has_examples() -> None:
    main = spotray("--help", env={"PATH": "/usr/bin:/bin"})
    assert main.returncode == 0
    assert "exit codes:" in main.stdout
    assert "3    not found" in main.stdout
    for command in ("run", "submit", "status", "watch", "logs", "checkpoints", "pull", "plot"):
        result = spotray(command, "--help", env={"PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, command
        assert "examples:" in result.stdout, command
    assert spotray("pull", env={"PATH": "/usr/bin:/bin"}).returncode == 2  # usage error


def test_pull_checks_the_run_key_when_it_is_set_and_says_plainly_when_it_is_not(
    s3_store: S3ObjectStore, s3_uri: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """checkpoint-10 signed with the run's key; checkpoint-20 complete by its sizes, written by a writer
    of the bucket without the key (issue #38, item 4)."""
    key = "k" * 64
    save_checkpoint(replace(s3_store, checkpoint_key=CheckpointKey(key.encode())), tmp_path, 10)
    save_checkpoint(s3_store, tmp_path, 20)
    keyed = {**s3_env, CHECKPOINT_KEY_ENV: key}

    listing = json.loads(spotray("checkpoints", s3_uri, "-o", "json", env=keyed).stdout)
    assert [(c["step"], c["complete"]) for c in listing] == [(20, False), (10, True)]
    assert "is not signed" in listing[0]["problem"]

    pulled = spotray("pull", s3_uri, str(tmp_path / "keyed"), env=keyed)
    assert pulled.returncode == 0, pulled.stderr
    assert "pulled checkpoint-10" in pulled.stdout
    assert "signed with the run's key" in pulled.stdout

    unchecked = spotray("pull", s3_uri, "--step", "10", str(tmp_path / "unchecked"), env=s3_env)
    assert unchecked.returncode == 0, unchecked.stderr
    assert f"signature was NOT checked: {CHECKPOINT_KEY_ENV} is not set" in unchecked.stdout
    assert "kubectl get secret spotray-checkpoint-key" in unchecked.stdout

    unsigned = spotray("pull", s3_uri, "--step", "20", str(tmp_path / "unsigned"), env=s3_env)
    assert unsigned.returncode == 0, unsigned.stderr
    assert "its manifest is not signed" in unsigned.stdout

    refused = spotray("pull", s3_uri, "--step", "20", str(tmp_path / "refused"), env=keyed)
    assert refused.returncode == 1
    assert "checkpoint-20 under" in refused.stderr
    assert "is not signed" in refused.stderr
    assert not (tmp_path / "refused").exists()
