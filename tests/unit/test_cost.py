"""status.cost: the chart's prices, checked, and the run's cost beside an on-demand run of its steps."""

import json
from datetime import UTC, datetime

import pytest

from spotray.cli.run_status import cost_line, describe_run
from spotray.contract.errors import SpotrayError
from spotray.contract.spec import WorkerSpec
from spotray.contract.status import Cost, Goodput, LostSeconds
from spotray.controller.config import ControllerConfig
from spotray.decisions.cost import PRICES_ENV, Prices, run_cost

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)
PRICES = Prices(currency="USD", spot_per_hour=1.0, on_demand_per_hour=3.0, head_per_hour=0.5)
# An hour of wall time: 40 min of steps that survived, 2 min of start-up, the rest lost to preemptions.
LEDGER = Goodput(wall_seconds=3600, surviving_step_seconds=2400, lost_seconds=LostSeconds(start_up=120, restarts=600))


def test_spot_costs_the_wall_time_and_on_demand_the_surviving_steps_plus_one_start() -> None:
    cost = run_cost(LEDGER, WorkerSpec(replicas=2, spot=True), PRICES, (), NOW)
    # run: 1 h x (2 x 1.0 + 0.5); on demand: (2400 + 120) s = 0.7 h x (2 x 3.0 + 0.5)
    assert cost == Cost(currency="USD", run=2.5, on_demand_same_steps=4.55, saved_ratio=0.451)


def test_spare_pods_cost_what_they_hold_and_an_on_demand_run_needs_none() -> None:
    cost = run_cost(LEDGER, WorkerSpec(replicas=2, spare_replicas=1, spot=True), PRICES, (), NOW)
    # run: 1 h x (3 x 1.0 + 0.5); on demand, no interruption to stand by for: as without spares
    assert (cost.run, cost.on_demand_same_steps) == (3.5, 4.55)


def test_workers_off_spot_pay_the_on_demand_price_and_spot_can_cost_more() -> None:
    cost = run_cost(LEDGER, WorkerSpec(replicas=2, spot=False), PRICES, (), NOW)
    assert cost.run == 6.5
    assert cost.saved_ratio < 0
    assert cost_line(cost) == "6.50 USD so far; on demand, the same steps: 4.55 USD (spot cost 43% more)"
    assert run_cost(Goodput(wall_seconds=5), WorkerSpec(), PRICES, (), NOW).saved_ratio is None, (
        "no steps yet: no ratio"
    )


def test_prices_come_from_the_environment_and_none_means_no_cost() -> None:
    assert ControllerConfig.from_env({}).prices is None
    assert ControllerConfig.from_env({PRICES_ENV: "{}"}).prices is None  # the chart's default
    config = ControllerConfig.from_env({PRICES_ENV: json.dumps({"spotPerHour": 1, "onDemandPerHour": 3.5})})
    assert config.prices == Prices(currency="", spot_per_hour=1.0, on_demand_per_hour=3.5, head_per_hour=0.0)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("spot=1", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"spotPerHour": 1}', "missing keys \\['onDemandPerHour'\\]"),
        ('{"spotPerHour": 1, "onDemandPerHour": 2, "gpuPerHour": 9}', "unknown keys \\['gpuPerHour'\\]"),
        ('{"spotPerHour": -1, "onDemandPerHour": 2}', "spotPerHour must be a number >= 0"),
        ('{"spotPerHour": "1", "onDemandPerHour": 2}', "spotPerHour must be a number >= 0"),
        ('{"spotPerHour": true, "onDemandPerHour": 2}', "spotPerHour must be a number >= 0"),
        ('{"spotPerHour": 1, "onDemandPerHour": 2, "currency": 7}', "currency must be a short text"),
    ],
)
def test_prices_that_are_not_prices_are_refused_with_an_example(raw: str, problem: str) -> None:
    with pytest.raises(SpotrayError, match=problem) as refused:
        Prices.from_env({PRICES_ENV: raw})
    assert "spotPerHour" in refused.value.fix


def test_status_shows_the_cost_line() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    run = {
        "metadata": {"name": "gpt2", "namespace": "team-a", "creationTimestamp": "2026-01-01T11:00:00Z"},
        "spec": {},
        "status": {"phase": "Running", "cost": run_cost(LEDGER, WorkerSpec(replicas=2), PRICES, (), NOW).to_status()},
    }
    assert "Cost:            2.50 USD so far; on demand, the same steps: 4.55 USD (spot saved 45%)" in describe_run(
        run, now
    )
