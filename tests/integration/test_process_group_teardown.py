"""Leaving the process group never hangs (torch 2.6 and 2.7 with gloo; docs/install.md).

Torch before 2.8 destroys ProcessGroupGloo holding the GIL and joins gloo's threads, while one of
them may still need the GIL to free a collective's tensors: each waits for the other for ever. In
the lowest compat row (torch 2.6) this script hung in 2 runs of 2 with ``dist.destroy_process_group()``
and exits with ``spotray.train.processes.ranks.destroy_process_group()``. On newer torch it passes either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.core]


def test_leaving_the_process_group_with_a_collective_in_flight_ends_on_every_rank(tmp_path: Path) -> None:
    run_ranks(Path(__file__).with_name("teardown_script.py"), [str(tmp_path)], dict(os.environ), timeout_s=90)
    for rank in (0, 1):
        assert (tmp_path / f"rank-{rank}.txt").read_text() == "left the process group"
