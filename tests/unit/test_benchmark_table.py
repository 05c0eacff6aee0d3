"""docs/benchmarks.md's results table is the one bench/results/*.json make (bench/results_table.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench import results_table
from bench.common import RESULTS_DIR, ROOT

pytestmark = pytest.mark.unit


def full_history() -> bool:
    done = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.returncode == 0 and done.stdout.strip() == "false"


@pytest.mark.skipif(not full_history(), reason="which results are stale is read from the whole git history")
def test_the_docs_table_is_the_one_the_result_files_make() -> None:
    docs = results_table.DOCS.read_text()
    assert results_table.docs_with_table(docs, results_table.table()) == docs, (
        "run `python -m bench.results_table --write` (make bench-table) and commit docs/benchmarks.md"
    )


def test_every_result_file_has_a_row_and_what_it_measures() -> None:
    names = {json.loads(path.read_text())["name"] for path in RESULTS_DIR.glob("*.json")}
    table = results_table.table()
    for name in names:
        assert f"| {name} |" in table
        assert results_table.measured_paths(name), name
        for path in results_table.measured_paths(name):
            assert (ROOT / path).exists(), f"{name} measures {path}, which is not there"
