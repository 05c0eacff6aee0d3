"""The layout rule of docs/architecture.md: everything is imported as `spotray.*`.

`train`, `controller` and `jobs` are folders, reached as `spotray.train` and so on through the
symlinks in spotray/. An import of a bare `train` would work from the repository root and break in
a user's directory that holds its own train.py, so it is refused here, in code and in commands.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.core]

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("train", "controller", "jobs")


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.splitlines() if (ROOT / name).is_file() and not (ROOT / name).is_symlink()]


def test_the_namespace_symlinks_point_at_the_top_level_folders() -> None:
    for folder in FOLDERS:
        link = ROOT / "spotray" / folder
        assert link.is_symlink(), f"spotray/{folder} must be a symlink to ../{folder}"
        assert link.readlink() == Path("..") / folder
        assert (ROOT / folder / "__init__.py").exists()


def test_no_python_file_imports_a_bare_top_level_folder() -> None:
    offenders = []
    for path in (p for p in tracked_files() if p.suffix == ".py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FOLDERS]
    assert not offenders, "import these as spotray.<folder>...: " + ", ".join(offenders)


def test_no_command_runs_a_bare_top_level_module() -> None:
    pattern = re.compile(r"""(-m[\s"',]+|\[python, -m, )(train|controller|jobs)\b""")
    offenders = []
    for path in tracked_files():
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".sh", ".tpl", ".txt"} and path.name not in {
            "Makefile",
            "Dockerfile",
        }:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
