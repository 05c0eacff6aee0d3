"""Prometheus metrics of the controller, served as text at ``:SPOTRAY_METRICS_PORT/metrics``.

- ``spotray_trainingruns{phase}``: runs this controller knows, by phase (from its last reconcile);
- ``spotray_attempts_started_total``, ``spotray_attempt_outcomes_total{outcome}``: attempts, and how
  they ended (Preempted vs Failed is the number to watch on spot capacity);
- ``spotray_reconcile_seconds``: reconcile latency; ``spotray_reconcile_errors_total``: failed ones;
- ``spotray_refreshes_total``, ``spotray_refresh_interval_seconds``, ``spotray_urgent_backlog``: the
  work queue (controller/work_queue.py): periodic refreshes started, how often each active run is
  refreshed now (it grows past ``runs / SPOTRAY_REFRESHES_PER_SECOND``), urgent requests waiting
  or being reconciled;
- ``spotray_store_reads_total{kind}``: S3 reports of running attempts, ``full`` or ``unchanged``
  (the progress object's ETag had not moved, so only one LIST was made).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spotray.contract.names import FAILED, PENDING, RESUMING, RUNNING, SUCCEEDED, SUSPENDED

REGISTRY = CollectorRegistry()
ATTEMPTS_STARTED = Counter("spotray_attempts_started", "RayJobs created, one per attempt", registry=REGISTRY)
ATTEMPT_OUTCOMES = Counter("spotray_attempt_outcomes", "Attempts ended, by outcome", ["outcome"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram(
    "spotray_reconcile_seconds",
    "Time to reconcile one TrainingRun",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter("spotray_reconcile_errors", "Reconciles that raised", registry=REGISTRY)
REFRESHES = Counter("spotray_refreshes", "Periodic refreshes of active runs started", registry=REGISTRY)
STORE_READS = Counter("spotray_store_reads", "S3 reports of running attempts, by kind", ["kind"], registry=REGISTRY)
REFRESH_INTERVAL = Gauge(
    "spotray_refresh_interval_seconds", "Seconds between two refreshes of one active run", registry=REGISTRY
)
URGENT_BACKLOG = Gauge(
    "spotray_urgent_backlog", "Urgent reconcile requests waiting for a worker or in progress", registry=REGISTRY
)

_phases: dict[str, str] = {}
_phases_lock = threading.Lock()


def set_phase(namespace: str, name: str, phase: str) -> None:
    with _phases_lock:
        _phases[f"{namespace}/{name}"] = phase


def known_runs() -> int:
    with _phases_lock:
        return len(_phases)


def forget_run(namespace: str, name: str) -> None:
    with _phases_lock:
        _phases.pop(f"{namespace}/{name}", None)


class _PhaseCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        with _phases_lock:
            counts = Tally(_phases.values())
        family = GaugeMetricFamily("spotray_trainingruns", "TrainingRuns by phase", labels=["phase"])
        for phase in (PENDING, RUNNING, RESUMING, SUSPENDED, SUCCEEDED, FAILED):
            family.add_metric([phase], counts.get(phase, 0))
        yield family


REGISTRY.register(_PhaseCollector())


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from other pods
    start_http_server(port, addr=address, registry=REGISTRY)
