"""``spotray completion bash``: the script passes shellcheck and completes commands, flags, a flag's
choices and (through kubectl) run names, in a real bash (issue 72)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spotray.cli.completion import completion_script
from spotray.cli.main import build_parser
from tests.unit.test_deploy_files import dev_tool

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "spotray.bash"
    path.write_text(completion_script(build_parser(), "bash"))
    return path


def complete(script: Path, *words: str, path: str = "/usr/bin:/bin") -> list[str]:
    """What bash offers for the last of ``words`` (``spotray`` first), with kubectl found on ``path``."""
    quoted = " ".join(f"'{w}'" for w in ("spotray", *words))
    program = (
        f'source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _spotray; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, env={"PATH": path})
    return [line for line in result.stdout.splitlines() if line]


def test_the_script_passes_shellcheck(script: Path) -> None:
    result = subprocess.run(
        [dev_tool("shellcheck"), "-s", "bash", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_it_completes_commands_flags_and_choices(script: Path) -> None:
    assert complete(script, "sus") == ["suspend"]
    assert complete(script, "run", "--lo") == ["--local", "--lose-worker-at"]
    assert complete(script, "status", "-o", "") == ["table", "json", "yaml"]
    assert "--all-namespaces" in complete(script, "status", "--all")


def test_it_offers_the_namespaces_runs_from_kubectl(script: Path, tmp_path: Path) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text('#!/bin/sh\n[ "$3" = "-n" ] && [ "$4" = "team" ] && echo "gpt2-a gpt2-b other"\n')
    kubectl.chmod(0o755)
    offered = complete(script, "watch", "-n", "team", "gpt2", path=f"{tmp_path}:/usr/bin:/bin")
    assert offered == ["gpt2-a", "gpt2-b"]


def test_zsh_gets_the_same_through_bashcompinit() -> None:
    zsh = completion_script(build_parser(), "zsh")
    assert zsh.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert "complete -o default -F _spotray spotray" in zsh
