"""The README is for a newcomer (issue 72): short, the two commands first, three quick paths, links
that resolve, and no project history (that lives in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
