"""What an async save does when it comes while the previous one is still being written.

Here, not in train/checkpoints/async_checkpoint.py, so that a job's flags can name the choices
without importing torch and transformers (a driver's imports are start-up time: issue 39).
"""

from __future__ import annotations

from typing import Literal

WhenBusy = Literal["wait", "skip"]
WHEN_BUSY_CHOICES: tuple[WhenBusy, ...] = ("wait", "skip")


def when_busy_policy(value: str) -> WhenBusy:
    """``value`` as a policy, or a ValueError that lists the choices."""
    for choice in WHEN_BUSY_CHOICES:
        if value == choice:
            return choice
    raise ValueError(f"when_busy must be one of {', '.join(WHEN_BUSY_CHOICES)}, not {value!r}")
