"""The module maps a newcomer reads name every module there is (issue #70: the controller's docstring
missed 7 of its 21 modules, docs/controller.md missed ownership.py, docs/architecture.md the contract's
status.py). A module added without a line in its map fails here, naming the map to add it to."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def modules(folder: str) -> list[str]:
    return sorted(p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize(
    ("folder", "map_file", "written"),
    [
        ("controller", "controller/__init__.py", "{name}"),
        ("controller", "docs/controller.md", "`controller/{name}`"),
        ("spotray/contract", "docs/architecture.md", "({name})"),
        ("spotray/decisions", "docs/architecture.md", "({name})"),
        ("spotray/cli", "spotray/cli/__init__.py", "{name}"),
        ("spotray/local", "spotray/local/__init__.py", "{name}"),
        ("spotray/decisions", "docs/controller.md", "`spotray/decisions/{name}`"),
    ],
)
def test_every_module_has_its_line_in_the_map(folder: str, map_file: str, written: str) -> None:
    text = (ROOT / map_file).read_text()
    missing = [name for name in modules(folder) if written.format(name=name) not in text]
    assert missing == [], f"{map_file} does not name {missing}: give each a line in its module map"
