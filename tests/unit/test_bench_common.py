"""The A vs B helpers the start-up benchmarks share (bench/common.py)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from bench import common
from bench.common import alternating_pairs, alternating_rounds, paired_legs, script_leg

pytestmark = pytest.mark.unit

# A leg as the benchmarks write one: its side in argv, its figures as JSON on the last stdout line.
SCRIPT = """
import json, sys
print("noise first", file=sys.stderr)
print("a line before the figures")
print(json.dumps({"seconds": 2.0 if sys.argv[1] == "fast" else 4.0}))
"""


def test_a_script_leg_returns_its_last_line_as_json_and_all_it_wrote() -> None:
    result, output = script_leg(SCRIPT, "fast")
    assert result == {"seconds": 2.0}
    assert "a line before the figures" in output
    assert "noise first" in output


def test_paired_legs_take_the_first_side_over_the_second_round_by_round() -> None:
    legs = alternating_rounds({side: functools.partial(lambda s: script_leg(SCRIPT, s)[0], side)
                               for side in ("fast", "slow")}, rounds=2)  # fmt: skip
    ratio, details = paired_legs(legs, "seconds", "a figure")
    assert ratio == 0.5
    assert details["pair_ratios"] == [0.5, 0.5]
    assert details["medians_s"] == {"fast": 2.0, "slow": 4.0}
    assert details["figure"] == "a figure"
    assert details["legs"] == {"fast": [{"seconds": 2.0}] * 2, "slow": [{"seconds": 4.0}] * 2}


def test_alternating_pairs_put_neither_setting_always_first() -> None:
    legs = list(alternating_pairs(3, "kept", "new"))
    assert legs == [
        ("kept", "kept-1"),
        ("new", "new-1"),
        ("new", "new-2"),
        ("kept", "kept-2"),
        ("kept", "kept-3"),
        ("new", "new-3"),
    ]


def test_the_commit_a_result_measured_ignores_result_files_but_not_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark that writes its result after each leg found its own file and said "+changes"
    (head_to_head_real_pods at db4036a); a changed source file still says so."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    git("add", "code.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "code")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "bench" / "results")
    head = git("rev-parse", "--short", "HEAD")
    (tmp_path / "bench" / "results" / "leg_by_leg.json").write_text("{}\n")
    assert common.current_commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.current_commit() == f"{head}+changes"
