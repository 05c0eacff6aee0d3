"""`spotray logs RUN --attempt N` when attempt N's RayJob is gone: why, not only "not found"."""

from __future__ import annotations

from typing import Any

import pytest

from spotray.cli.exit_codes import NotFoundError
from spotray.cli.logs import logs_command

pytestmark = pytest.mark.unit


class ClusterWithoutRayJobs:
    """A cluster where the run exists and every RayJob is gone (a 404, as ClusterConnection raises it)."""

    namespace = "team"

    def __init__(self, attempts: list[dict[str, Any]]) -> None:
        self.run = {"metadata": {"name": "r"}, "status": {"attempt": len(attempts), "attempts": attempts}}

    def get_run(self, name: str) -> dict[str, Any]:
        return self.run

    def get_ray_job(self, name: str) -> dict[str, Any]:
        raise NotFoundError(f"cannot get RayJob {name}: not found", "`spotray status -n NAMESPACE` lists the runs")


ATTEMPTS = [
    {"attempt": 1, "outcome": "Preempted", "reason": "SpotNotice", "rayJob": "r-a1"},
    {"attempt": 2, "outcome": "Failed", "reason": "TrainingFailed", "rayJob": "r-a2"},
]


def test_a_preempted_attempts_logs_are_said_to_be_gone_with_its_cluster() -> None:
    with pytest.raises(NotFoundError) as caught:
        logs_command(ClusterWithoutRayJobs(ATTEMPTS), "r", 1, None)  # type: ignore[arg-type]
    assert "attempt 1 of team/r ended Preempted" in str(caught.value)
    assert "deleted with its Ray cluster" in str(caught.value)


def test_any_other_missing_rayjob_keeps_the_api_servers_words() -> None:
    with pytest.raises(NotFoundError) as caught:
        logs_command(ClusterWithoutRayJobs(ATTEMPTS), "r", 2, None)  # type: ignore[arg-type]
    assert "cannot get RayJob r-a2: not found" in str(caught.value)
