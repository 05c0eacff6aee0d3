"""Shared by the benchmarks: one result-file format, and a description of the machine."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]  # the repository's root: benches run from there (python -m bench...)
RESULTS_DIR = ROOT / "bench" / "results"
T = TypeVar("T")


def paired_ratio(a: list[float], b: list[float]) -> tuple[float, list[float]]:
    """A vs B over rounds run back to back: the median of each round's A / B, and each round's ratio."""
    pairs = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(pairs), [round(r, 3) for r in pairs]


def timed_process(command: list[str], timeout_s: float = 600) -> float:
    """Wall seconds of ``command`` as a whole process, its start-up included (it must exit 0)."""
    began = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, timeout=timeout_s)
    return time.monotonic() - began


def alternating_rounds(legs: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Each leg ``rounds`` times, back to back in alternating order (A B, then B A, ...): the pairs a
    paired ratio is taken from, in order. Prints each round's results as it ends."""
    names = list(legs)
    results: dict[str, list[T]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            results[name].append(legs[name]())
        print(f"round {index + 1}: " + ", ".join(f"{name} {results[name][-1]}" for name in names), flush=True)
    return results


def alternating_pairs(pairs: int, first: str, second: str) -> Iterator[tuple[str, str]]:
    """(setting, leg name) for ``pairs`` A vs B pairs back to back, neither setting always first (A B,
    then B A, ...); each leg is named ``<setting>-<pair>``."""
    for pair in range(1, pairs + 1):
        for setting in (first, second) if pair % 2 else (second, first):
            yield setting, f"{setting}-{pair}"


def alternating_processes(sides: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """Each side's command as a whole process (``alternating_rounds``), after one warm-up of the last
    side (the page cache); wall seconds per side, in order."""
    timed_process(list(sides.values())[-1])
    return alternating_rounds(
        {name: functools.partial(_timed_seconds, command) for name, command in sides.items()}, rounds
    )


def _timed_seconds(command: list[str]) -> float:
    return round(timed_process(command), 3)


def script_leg(script: str, side: str, timeout_s: float = 600) -> tuple[dict[str, Any], str]:
    """One leg of an A vs B: ``python -c script side`` as a whole process (it must exit 0). Returns the
    JSON object its last stdout line holds, and all it wrote (stdout then stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", script, side], capture_output=True, text=True, timeout=timeout_s, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stdout + done.stderr


def paired_legs(legs: Mapping[str, list[dict[str, Any]]], key: str, figure: str) -> tuple[float, dict[str, Any]]:
    """The ratio of ``alternating_rounds``' two sides (first over second) by each leg's ``key``, and the
    details a result file keeps: the figure, every leg, the medians, each pair's ratio, the machine."""
    a, b = legs
    seconds = {side: [leg[key] for leg in legs[side]] for side in (a, b)}
    ratio, pairs = paired_ratio(seconds[a], seconds[b])
    return ratio, {
        "figure": figure,
        "legs": dict(legs),
        "medians_s": {side: statistics.median(values) for side, values in seconds.items()},
        "pair_ratios": pairs,
        "machine": machine_details(),
    }


def goal_met(ratio: float, goal: str) -> bool:
    """Evaluate a goal written as ``">= 0.8"`` or ``"<= 1.10"`` against ``ratio``."""
    match = re.fullmatch(r"\s*(>=|<=)\s*([0-9.]+)\s*", goal)
    if match is None:
        raise ValueError(f"goal {goal!r} must look like '>= 0.8' or '<= 1.10'")
    bound = float(match.group(2))
    return ratio >= bound if match.group(1) == ">=" else ratio <= bound


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory, deleted afterwards: a benchmark writes gigabytes of checkpoints and S3 volumes."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def embedded_s3_env() -> dict[str, str]:
    """This process's environment without S3 endpoints or credentials, so that local mode starts its
    embedded S3 server, as `make demo` does, whatever this shell points at."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}


def machine_details() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}


def current_commit() -> str:
    """HEAD's short hash, "+changes" when the tree differs from it; "unknown" outside a checkout.

    Result files do not count: a benchmark that writes its result after each leg (bench/head_to_head)
    would otherwise find its own output and call the code it measured changed."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=RESULTS_DIR.parent, capture_output=True, text=True, check=False)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    changed = git("status", "--porcelain", "--", ":/", f":(top,exclude){RESULTS_DIR.relative_to(ROOT)}")
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def write_result(
    name: str,
    ratio: float,
    goal: str,
    baseline: str,
    command: str,
    details: dict[str, Any],
    goal_change: tuple[str, str] | None = None,
) -> Path:
    """Write ``bench/results/<name>.json`` (with the commit it measured) and return its path. A goal that
    changed keeps its old value and why (``goal_change``: the old goal, the reason), in the file and the table."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "commit": current_commit(),
        "ratio": round(ratio, 4),
        "goal": goal,
        "passed": goal_met(ratio, goal),
        "baseline": baseline,
        "command": command,
        "details": details,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if goal_change is not None:
        record["goal_was"], record["goal_change"] = goal_change
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path
