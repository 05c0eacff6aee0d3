"""The README is for a newcomer (issue 72): short, the two commands first, three quick paths, links
that resolve, and no project history (that lives in docs/)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from spotray.contract.spec import parse_training_run
from testbed import readme_path
from tests.unit.test_chart import run_helm

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_it_is_short_enough_to_read_in_one_go() -> None:
    assert len(README.splitlines()) <= 250


def test_the_first_code_block_is_the_two_commands() -> None:
    first = re.search(r"```bash\n(.*?)```", README, re.DOTALL)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_three_quick_paths_are_sections_and_are_linked_from_the_top() -> None:
    paths = re.findall(r"^## ([123]\. .+)$", README, re.MULTILINE)
    assert len(paths) == 3, paths
    top = README[: README.index("## 1.")]
    for title in paths:
        anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
        assert f"(#{anchor})" in top, f"the top does not link to '{title}' (#{anchor})"


def test_every_relative_link_resolves() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


def test_no_project_history_in_the_readme() -> None:
    """Issue numbers, commit hashes and CI timings belong in docs/ (test-times.md, benchmarks.md)."""
    assert not re.search(r"issue #?\d+|\bstop \d+\b", README, re.IGNORECASE)
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), re.search(r"\b[0-9a-f]{7,40}\b", README)


# What a reader would put in place of the cluster path's placeholders (testbed/readme_path.py).
READER_VALUES = {
    readme_path.REGISTRY: "registry.example.com/team",
    readme_path.ACCESS_KEY: "AWS_ACCESS_KEY_ID=AKIAEXAMPLE",
    readme_path.SECRET_KEY: "AWS_SECRET_ACCESS_KEY=example-secret",
    readme_path.S3_ENDPOINT: "https://s3.eu-west-1.amazonaws.com",
    readme_path.BUCKET: "team-runs",
}


def test_the_cluster_paths_helm_install_renders_the_chart_as_written() -> None:
    """The README's `helm install`, its placeholders filled, as `helm template`: the values file it names
    exists and the chart accepts every value it sets (the real-pods run of the whole path is in
    tests/e2e/test_readme_cluster_path.py, a campaign)."""
    [install] = [c for c in readme_path.cluster_path_commands() if c.startswith("helm install ")]
    args = shlex.split(readme_path.fill(install, READER_VALUES), comments=True)
    template = ["template", *(arg for arg in args[2:] if arg != "--create-namespace")]
    result = run_helm(*template)
    assert result.returncode == 0, result.stderr
    deployments = [d for d in yaml.safe_load_all(result.stdout) if d and d.get("kind") == "Deployment"]
    assert deployments, "no controller Deployment rendered"


def test_the_cluster_paths_training_run_is_valid_once_its_bucket_is_filled_in() -> None:
    """The README pipes jobs/gpt2/trainingrun.yaml through sed into kubectl: the sed finds what it
    replaces, and what comes out passes `spotray validate`."""
    [apply] = [c for c in readme_path.cluster_path_commands() if "kubectl apply" in c]
    produce = readme_path.fill(apply, READER_VALUES).split(" | kubectl apply")[0]
    made = subprocess.run(["bash", "-c", produce], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"s3://{READER_VALUES[readme_path.BUCKET]}/" in made, "the README's sed no longer matches the file"
    run = parse_training_run(yaml.safe_load(made), where="the README's TrainingRun")
    assert run.spec.checkpoint.uri.startswith(f"s3://{READER_VALUES[readme_path.BUCKET]}/")
