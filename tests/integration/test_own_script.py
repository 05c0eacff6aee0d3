"""The README's own-script example, run as it is printed, as a user's `train.py`.

The script runs from a directory that also holds the user's own `jobs.py`, `controller.py` and
`data.py`; each exits loudly if anything imports it, so a library module that still resolves a
generic top-level name fails this test. The script is SIGKILLed once a complete checkpoint is in
S3, then started again: it must resume from that checkpoint and finish. Given SIGTERM instead (a
spot notice, no Ray anywhere), it must save at once and stop on that checkpoint.

Needs only `spotray[train]` (marker `core`): `make test-compat` runs it in every supported Python
and transformers, with spotray installed from the wheel and no Ray.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.storage.store import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.core]

README = Path(__file__).resolve().parents[2] / "README.md"
# the script itself is the user's train.py; these are the user's other modules
SHADOWS = ("jobs", "controller", "data", "bench")


def readme_own_script() -> str:
    """The first Python block of the README's own-script quick path."""
    section = README.read_text().split("## 2. Make your own Hugging Face script spot-safe", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README: the own-script section lost its python block"
    return match.group(1)


def user_directory(root: Path) -> Path:
    root.mkdir()
    for name in SHADOWS:
        (root / f"{name}.py").write_text(f'raise SystemExit("the user\'s own {name}.py was imported by spotray")\n')
    (root / "train.py").write_text(readme_own_script())
    return root


def start_for_ever(command: list[str], work: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """The script with far more steps than it will get before the test stops it; its output piped."""
    return subprocess.Popen(
        [*command, "--max-steps", "100000"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_checkpoint(store: ObjectStore, process: subprocess.Popen[str], at_least: int) -> int:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        latest = latest_complete_checkpoint(store)
        if latest is not None and latest.step >= at_least:
            return latest.step
        assert process.poll() is None, f"the script ended early:\n{process.communicate()[0]}"
        time.sleep(0.2)
    raise AssertionError(f"no complete checkpoint at step >= {at_least} within 240 s")


def test_readme_script_resumes_after_a_kill_beside_the_users_own_modules(
    s3_env: dict[str, str], s3_uri: str, s3_store: ObjectStore, tmp_path: Path
) -> None:
    work = user_directory(tmp_path / "project")
    command = [sys.executable, "train.py", "--checkpoint-uri", s3_uri, "--save-steps", "10"]

    first = start_for_ever(command, work, s3_env)  # the kill comes first
    try:
        killed_after = wait_for_checkpoint(s3_store, first, at_least=20)
    finally:
        first.kill()
    first_output = first.communicate()[0]
    assert "fresh start" in first_output, first_output

    latest = latest_complete_checkpoint(s3_store)
    assert latest is not None
    assert latest.step >= killed_after
    final_step = latest.step + 10
    second = subprocess.run(
        [*command, "--max-steps", str(final_step)],
        cwd=work,
        env=s3_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = second.stdout + second.stderr
    assert second.returncode == 0, output
    assert f"resuming from step {latest.step}" in output, output
    finished = latest_complete_checkpoint(s3_store)
    assert finished is not None
    assert finished.step == final_step, output


def test_readme_script_takes_an_emergency_checkpoint_on_sigterm_without_ray(
    s3_env: dict[str, str], s3_uri: str, s3_store: ObjectStore, tmp_path: Path
) -> None:
    """A spot notice under plain python: no periodic save would come (save-steps 100000), so the
    checkpoint after the SIGTERM is the notice's, and the script ends on it, exit 0."""
    work = user_directory(tmp_path / "project")
    command = [sys.executable, "train.py", "--checkpoint-uri", s3_uri, "--save-steps", "100000"]
    process = start_for_ever(command, work, s3_env)
    assert process.stdout is not None
    try:
        lines = []
        for line in process.stdout:  # training has begun once the first loss is logged
            lines.append(line)
            if "'loss'" in line:
                break
        assert process.poll() is None, "".join(lines)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 0, output
    assert "preemption notice at step" in output, output
    emergency = latest_complete_checkpoint(s3_store)
    assert emergency is not None, output
    assert 10 <= emergency.step < 100000, output
