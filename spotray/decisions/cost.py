"""What a run cost on spot nodes, and what an on-demand run of the same steps would have cost.

Optional: the chart's ``prices`` values (``SPOTRAY_PRICES``, JSON) give what one node costs per
hour in each of the chart's pools, one worker pod per node::

    {"currency": "USD", "spotPerHour": 1.2, "onDemandPerHour": 3.9, "headPerHour": 0.2}

From the goodput ledger (status.goodput, train/records/goodput.py), ``status.cost`` is then:

- ``run``: the wall time so far, times the head node and ``replicas + spareReplicas`` worker nodes
  at their pool's price: ``onDemandPerHour`` for the time of attempts whose workers ran on on-demand
  nodes (``onDemandSeconds``: spot-then-on-demand's fallback, or capacity on-demand), ``spotPerHour``
  for the rest. The wall time includes
  every wait, restart and redone step: that is what spot costs. It counts every worker for all of
  it, so an elastic run that went on smaller, or a run waiting for capacity, is counted high;
- ``onDemandSameSteps``: what an uninterrupted run of the same surviving steps would cost on
  on-demand nodes: the surviving step time plus one start-up, at ``onDemandPerHour``;
- ``savedRatio``: 1 - run / onDemandSameSteps (negative when spot cost more).

Prices are the operator's; nothing here asks a cloud for them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from spotray.contract.errors import SpotrayError
from spotray.contract.spec import ON_DEMAND, SPOT_THEN_ON_DEMAND, WorkerSpec
from spotray.contract.status import AttemptStatus, Cost, Goodput, parse_timestamp

PRICES_ENV = "SPOTRAY_PRICES"
_FIELDS = {"spotPerHour": "spot_per_hour", "onDemandPerHour": "on_demand_per_hour", "headPerHour": "head_per_hour"}


@dataclass(frozen=True)
class Prices:
    """One node's price per hour in each pool (one worker pod per node), in ``currency``."""

    currency: str
    spot_per_hour: float
    on_demand_per_hour: float
    head_per_hour: float = 0.0

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> Prices | None:
        """``SPOTRAY_PRICES`` as prices; None when unset; a clear error when it is not prices."""
        raw = environ.get(PRICES_ENV, "").strip()
        if not raw or raw == "{}":
            return None
        example = '{"currency": "USD", "spotPerHour": 1.2, "onDemandPerHour": 3.9}'
        fix = f"set {PRICES_ENV} (the chart's `prices`) to e.g. {example}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as error:
            raise SpotrayError(f"{PRICES_ENV} is not valid JSON: {error}", fix) from None
        if not isinstance(value, dict):
            raise SpotrayError(f"{PRICES_ENV} must be a JSON object, got {raw!r}", fix)
        unknown = sorted(set(value) - {"currency", *_FIELDS})
        missing = sorted({"spotPerHour", "onDemandPerHour"} - set(value))
        if unknown or missing:
            raise SpotrayError(f"{PRICES_ENV}: unknown keys {unknown}, missing keys {missing}", fix)
        numbers: dict[str, float] = {}
        for key, name in _FIELDS.items():
            number = value.get(key, 0.0)
            is_number = isinstance(number, int | float) and not isinstance(number, bool)
            if not is_number or not math.isfinite(number) or number < 0:
                raise SpotrayError(f"{PRICES_ENV}: {key} must be a number >= 0, got {number!r}", fix)
            numbers[name] = float(number)
        currency = value.get("currency", "")
        if not isinstance(currency, str) or len(currency) > 16:
            raise SpotrayError(f"{PRICES_ENV}: currency must be a short text such as USD, got {currency!r}", fix)
        return cls(currency=currency, **numbers)


def run_cost(
    goodput: Goodput, workers: WorkerSpec, prices: Prices, attempts: Sequence[AttemptStatus], now: datetime
) -> Cost:
    """status.cost from status.goodput (whole seconds), the run's workers and where its attempts ran
    (see the module docstring)."""
    wall_s = float(goodput.wall_seconds or 0)
    start_up = goodput.lost_seconds.start_up if goodput.lost_seconds else None
    same_steps_h = (float(goodput.surviving_step_seconds or 0) + float(start_up or 0)) / 3600
    on_demand_s = wall_s if workers.capacity_policy == ON_DEMAND else min(on_demand_seconds(attempts, now), wall_s)
    worker_hours = (on_demand_s * prices.on_demand_per_hour + (wall_s - on_demand_s) * prices.spot_per_hour) / 3600
    run = workers.pods * worker_hours + wall_s / 3600 * prices.head_per_hour  # spares cost what they hold
    on_demand = same_steps_h * (workers.replicas * prices.on_demand_per_hour + prices.head_per_hour)
    return Cost(
        currency=prices.currency,
        run=round(run, 2),
        on_demand_same_steps=round(on_demand, 2),
        saved_ratio=round(1 - run / on_demand, 3) if on_demand > 0 else None,  # no steps yet: no ratio
        on_demand_seconds=round(on_demand_s) if workers.capacity_policy == SPOT_THEN_ON_DEMAND else None,
    )


def on_demand_seconds(attempts: Sequence[AttemptStatus], now: datetime) -> float:
    """The time of the attempts (kept in status) whose workers ran on on-demand nodes."""
    total = 0.0
    for attempt in attempts:
        start = parse_timestamp(attempt.start_time)
        if start is None or attempt.capacity != ON_DEMAND:
            continue
        end = parse_timestamp(attempt.end_time) or now
        total += max((end - start).total_seconds(), 0.0)
    return total
