"""Shared by the runtime benchmarks: start the GPT-2 job against a local S3 server and read its events."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotray.train.records.event_log import read_events


def gpt2_command(
    checkpoint_uri: str, data_uri: str, workdir: Path, *, workers: int, max_steps: int, save_steps: int
) -> list[str]:
    return [
        "-m", "spotray.jobs.gpt2",
        "--checkpoint-uri", checkpoint_uri,
        "--data-uri", data_uri,
        "--workers", str(workers),
        "--workdir", str(workdir),
        "--max-steps", str(max_steps),
        "--save-steps", str(save_steps),
        "--batch-size", "16",
        "--events", str(workdir / "events.jsonl"),
    ]  # fmt: skip


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_event(
    events: Path,
    match: Callable[[dict[str, Any]], bool],
    child: subprocess.Popen[bytes],
    *,
    timeout_s: float = 600,
    after: float = 0.0,
) -> dict[str, Any]:
    """The first event (written at or after ``after``) that ``match`` accepts; fails if the job exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in read_events(events):
            if event["time"] >= after and match(event):
                return event
        if child.poll() is not None:
            raise RuntimeError(f"the job exited with {child.returncode} before the awaited event")
        time.sleep(0.05)
    raise TimeoutError(f"no matching event in {events} within {timeout_s} s")


def steps_per_second(events: Path, skip: int) -> float:
    """Training speed from the step events after the first ``skip`` steps (warm-up and startup excluded)."""
    steps = [(e["step"], e["time"]) for e in read_events(events) if e["event"] == "step" and e["step"] > skip]
    (first_step, first_time), (last_step, last_time) = steps[0], steps[-1]
    return (last_step - first_step) / (last_time - first_time)


def python_env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra, "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}


PYTHON = sys.executable
