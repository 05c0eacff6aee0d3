"""Bad manifest files, as a user writes them, through the CLI's entry point: never a traceback,
every problem at once, the file named, and a hint for a misspelt field (issue 72).

``validate`` needs no cluster; ``submit`` refuses the same files before it loads the Kubernetes client.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.cli.main import main
from spotray.cli.run_status import status_table
from spotray.contract.attempts import EXIT_BAD_INPUT, EXIT_OK

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GOOD = """apiVersion: spotray.dev/v1alpha1
kind: TrainingRun
metadata: {name: good}
spec:
  entrypoint: python train.py
  checkpoint: {uri: s3://bucket/runs/good}
"""
BAD_FILES = {
    "typo.yaml": GOOD.replace("entrypoint:", "entrypoin:"),
    "number-image.yaml": GOOD + "  image: 123\n",
    "bad-secret.yaml": GOOD.replace(
        "{uri: s3://bucket/runs/good}", '{uri: s3://bucket/runs/good, secretRef: "Bad Name"}'
    ),
    "broken.yaml": "spec: [1\n",
    "list.yaml": "- a\n- b\n",
    "empty.yaml": "",
    "binary.yaml": b"\xff\xfe\x00garbage",
    "tabs.yaml": "spec:\n\tentrypoint: x\n",
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {}
    for name, content in BAD_FILES.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        made[name] = path
    (tmp_path / "good.yaml").write_text(GOOD)
    made["good.yaml"] = tmp_path / "good.yaml"
    made["a-directory"] = tmp_path
    made["missing.yaml"] = tmp_path / "missing.yaml"
    return made


@pytest.mark.parametrize("command", ["validate", "submit"])
@pytest.mark.parametrize("name", [*BAD_FILES, "a-directory", "missing.yaml"])
def test_a_bad_file_is_refused_with_its_name_and_no_traceback(
    command: str, name: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, str(files[name])])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "Traceback" not in err
    assert str(files[name]) in err
    assert "<unicode string>" not in err
    assert "fix:" in err


def test_validate_lists_every_problem_with_a_hint_for_a_typo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        GOOD.replace("entrypoint:", "entrypoin:").replace(
            "{uri: s3://bucket/runs/good}", '{uri: s3://bucket/runs/good, secretRef: "Bad Name", evrySteps: 5}'
        )
        + "  image: 123\n"
    )
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "spec.entrypoin: unknown field; did you mean entrypoint?" in err
    assert "spec.checkpoint.evrySteps: unknown field; did you mean everySteps?" in err
    assert "spec.entrypoint: missing" in err
    assert "spec.image: must be a non-empty string, got 123" in err
    assert "spec.checkpoint.secretRef: must be a DNS subdomain" in err


def test_validate_says_what_each_good_file_is_and_fails_if_any_is_bad(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = ROOT / "jobs" / "gpt2" / "sweep.yaml"
    assert main(["validate", str(files["good.yaml"]), str(sweep)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{files['good.yaml']}: a valid TrainingRun 'good'" in out
    assert f"{sweep}: a valid TrainingSweep 'gpt2-lr'" in out

    assert main(["validate", str(files["good.yaml"]), str(files["typo.yaml"])]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert "a valid TrainingRun 'good'" in captured.out
    assert "typo.yaml" in captured.err


def test_a_quantity_may_still_be_a_number(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(GOOD + "  workers: {replicas: 2, cpu: 2}\n")
    assert main(["validate", str(path)]) == EXIT_OK


def test_status_of_every_namespace_adds_a_namespace_column() -> None:
    runs = [
        {"metadata": {"name": "a", "namespace": "team-a", "creationTimestamp": "2026-12-01T00:00:00Z"}},
        {"metadata": {"name": "b", "namespace": "team-b", "creationTimestamp": "2026-12-01T00:00:00Z"}},
    ]
    header, first, second = status_table(runs, with_namespace=True).splitlines()
    assert header.split()[:2] == ["NAMESPACE", "NAME"]
    assert first.split()[:2] == ["team-a", "a"]
    assert second.split()[:2] == ["team-b", "b"]
    assert status_table(runs).splitlines()[0].split()[0] == "NAME"


def test_status_refuses_a_run_name_with_every_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "some-run", "-A"]) == EXIT_BAD_INPUT
    assert "drop -A, or RUN" in capsys.readouterr().err


def test_plot_has_no_short_output_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """-o is a format everywhere (status, checkpoints); plot's file is --output only."""
    with pytest.raises(SystemExit):
        main(["plot", "s3://bucket/run", "-o", "x.png"])
    assert "unrecognized arguments: -o" in capsys.readouterr().err
