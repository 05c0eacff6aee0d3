"""The head-to-head's figures and plan (bench/head_to_head/real_pods.py): both legs' records read the
same way, goodput from the steps that survived, steps redone at each new worker group."""

from __future__ import annotations

import pytest

from bench.head_to_head.real_pods import (
    GOAL,
    SETTINGS_GOAL,
    Group,
    comparison,
    disruption_schedule,
    leg_figures,
    leg_order,
    ray_documented_groups,
    ray_documented_manifests,
    spotray_groups,
    step_seconds,
)
from spotray.train.records.progress_log import AttemptProgress

pytestmark = pytest.mark.unit


def paced(first: int, last: int, began: float, pace: float = 1.0) -> tuple[tuple[int, float | None, float], ...]:
    return tuple((step, 2.0, began + (step - first + 1) * pace) for step in range(first, last + 1))


def test_an_uninterrupted_leg_has_a_goodput_of_its_steps_over_the_wall() -> None:
    # Submitted at 0, the group starts at 10 and trains 100 steps of 1 s: 100 s of 110.
    figures = leg_figures([Group(10.0, None, paced(1, 100, 10.0))], submitted=0.0, target=100)
    assert figures["goodput"] == pytest.approx(100 / 110, abs=1e-4)
    assert figures["wall_to_target_s"] == 110.0
    assert figures["steps_redone"] == []
    assert figures["final_loss"] == 2.0


def test_steps_trained_again_count_once_and_the_redone_ones_are_counted() -> None:
    first = Group(0.0, None, paced(1, 60, 0.0))  # trained to 60 by t=60, then lost
    second = Group(80.0, 40, paced(41, 100, 80.0))  # resumed from checkpoint 40
    figures = leg_figures([first, second], submitted=0.0, target=100)
    assert figures["steps_redone"] == [20]
    assert figures["useful_step_s"] == pytest.approx(100.0)  # steps 41-60 once, not twice
    assert figures["wall_to_target_s"] == 140.0
    assert figures["goodput"] == pytest.approx(100 / 140, abs=1e-4)


def test_a_leg_that_never_reaches_its_target_has_no_goodput() -> None:
    figures = leg_figures([Group(0.0, None, paced(1, 30, 0.0))], submitted=0.0, target=100)
    assert figures["reached_target"] is False
    assert "goodput" not in figures


def test_a_groups_first_step_counts_its_median_not_its_start_up() -> None:
    points = ((1, None, 50.0), (2, None, 51.0), (3, None, 52.0), (5, None, 54.0))
    assert step_seconds(points) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}


def test_spotray_attempts_and_restarts_in_them_become_groups() -> None:
    attempt = AttemptProgress(attempt=1, run_id="r", started=0.0, points=list(paced(1, 30, 0.0)))
    attempt.restarts = [(20, 40.0)]
    attempt.points += list(paced(21, 40, 40.0))
    later = AttemptProgress(attempt=2, run_id="r", resumed_from=40, started=100.0, points=list(paced(41, 50, 100.0)))
    groups = spotray_groups([attempt, later])
    assert [(g.started, g.resumed_from, g.points[0][0], g.points[-1][0]) for g in groups] == [
        (0.0, None, 1, 30),
        (40.0, 20, 21, 40),
        (100.0, 40, 41, 50),
    ]
    assert leg_figures(groups, 0.0, 50)["steps_redone"] == [10, 0]


def test_the_ray_documented_records_become_groups_in_time_order() -> None:
    records = [
        {"started": 90.0, "resumed_from": 25, "points": [[26, 1.5, 91.0]]},
        {"started": 1.0, "resumed_from": None, "points": [[1, 3.0, 2.0], [2, None, 3.0]]},
    ]
    assert [g.started for g in ray_documented_groups(records)] == [1.0, 90.0]


def test_thirty_minutes_get_three_reclaims_and_a_head_loss_between_the_first_two() -> None:
    assert disruption_schedule(3600, 0.5, 10.0) == [(600, "worker"), (1200, "head"), (1800, "worker"), (3000, "worker")]
    with pytest.raises(ValueError, match="no reclaim fits"):
        disruption_schedule(100, 0.5, 10.0)


def test_rounds_alternate_which_leg_goes_first() -> None:
    assert leg_order(["spotray", "ray-documented", "spotray-best"], 2) == [
        "spotray", "ray-documented", "spotray-best", "ray-documented", "spotray", "spotray-best",
    ]  # fmt: skip


def test_the_ray_documented_rayjob_is_plain_kuberay_with_its_script_on_the_head() -> None:
    config_map, rayjob = ray_documented_manifests("b", 400, 25, 0.5, "image:tag")
    assert "class ProgressLog" in config_map["data"]["ray_documented.py"]
    spec = rayjob["spec"]
    assert spec["backoffLimit"] > 0
    assert "--progress" in spec["entrypoint"]
    assert "--every 25" in spec["entrypoint"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    worker = spec["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["tolerations"]
    assert worker["nodeSelector"]
    assert spec["entrypoint"].startswith("python /home/ray/script/ray_documented.py")


def test_two_spotray_settings_compare_with_their_own_goal_and_name() -> None:
    # The chart's default decision (issue 74): the kept cluster against the defaults, no B leg.
    plan = comparison(["spotray-kept", "spotray"])
    assert plan.goal == SETTINGS_GOAL
    assert plan.name == "head_to_head_spotray_kept_vs_spotray"
    assert plan.against_ray_documented is False
    assert comparison(["spotray", "ray-documented", "spotray-best"]).goal == GOAL
    assert comparison(["spotray", "ray-documented"]).name == "head_to_head_real_pods"


@pytest.mark.parametrize("legs", [["spotray"], ["spotray", "spotray"], ["spotray", "torchrun"]])
def test_a_comparison_needs_two_different_known_legs(legs: list[str]) -> None:
    with pytest.raises(ValueError, match="--legs"):
        comparison(legs)


def test_the_ratio_pairs_the_first_two_legs_round_by_round() -> None:
    rows = [
        {"kind": "spotray-kept", "goodput": 0.9},
        {"kind": "spotray", "goodput": 0.8},
        {"kind": "spotray", "goodput": None},  # round 2: spotray did not reach its target
        {"kind": "spotray-kept", "goodput": 0.95},
    ]
    assert comparison(["spotray-kept", "spotray"]).pair_ratios(rows) == [pytest.approx(0.9 / 0.8)]
