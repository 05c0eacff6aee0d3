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
  (the progress object's ETag had not moved, so only one LIST was made);
- per run, labelled ``namespace`` and ``run``, from the status this controller last wrote or read
  (a finished run keeps its last values until it is deleted): ``spotray_run_step``,
  ``spotray_run_total_steps``, ``spotray_run_loss``, ``spotray_run_attempt``,
  ``spotray_run_preemptions``, ``spotray_run_failures``, ``spotray_run_goodput_ratio``,
  ``spotray_run_last_checkpoint_step``, ``spotray_run_last_checkpoint_timestamp_seconds`` (its age:
  ``time() - ...``), and ``spotray_run_phase{phase}`` (1 for the run's phase). The chart's Grafana
  dashboard (charts/spotray/dashboards/) draws them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spotray.contract.names import FAILED, PENDING, RESUMING, RUNNING, SUCCEEDED, SUSPENDED
from spotray.contract.status import RunStatus, parse_date_time

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


@dataclass(frozen=True)
class RunFigures:
    """What the metrics say of one run: its phase, and the figures of its status (None: not known yet)."""

    phase: str
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    attempt: int | None = None
    preemptions: int | None = None
    failures: int | None = None
    goodput_ratio: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_timestamp_seconds: float | None = None

    @classmethod
    def of(cls, status: RunStatus, phase: str | None = None) -> RunFigures:
        progress, checkpoint = status.progress, status.last_checkpoint
        checkpoint_time = None
        if checkpoint is not None and checkpoint.time:
            with contextlib.suppress(ValueError, TypeError):  # a time the status holds unreadably: no figure
                checkpoint_time = parse_date_time(checkpoint.time)
        return cls(
            phase=phase or status.phase or PENDING,
            step=progress.step if progress else None,
            total_steps=progress.total_steps if progress else None,
            loss=progress.loss if progress else None,
            attempt=status.attempt,
            preemptions=status.preemptions,
            failures=status.failures,
            goodput_ratio=status.goodput.ratio if status.goodput else None,
            last_checkpoint_step=checkpoint.step if checkpoint else None,
            last_checkpoint_timestamp_seconds=checkpoint_time.timestamp() if checkpoint_time else None,
        )


# The per-run gauges: (figure, metric name, help), in RunFigures' order.
RUN_GAUGES = (
    ("step", "spotray_run_step", "The latest completed training step"),
    ("total_steps", "spotray_run_total_steps", "Steps the run trains for in all"),
    ("loss", "spotray_run_loss", "The training loss at the latest step"),
    ("attempt", "spotray_run_attempt", "The current (or last) attempt, counting from 1"),
    ("preemptions", "spotray_run_preemptions", "Preemptions so far (spec.retry.maxPreemptions bounds them)"),
    ("failures", "spotray_run_failures", "Job failures so far (spec.retry.maxFailures bounds them)"),
    ("goodput_ratio", "spotray_run_goodput_ratio", "Goodput: surviving step time over wall time"),
    ("last_checkpoint_step", "spotray_run_last_checkpoint_step", "The step of the latest complete checkpoint"),
    (
        "last_checkpoint_timestamp_seconds",
        "spotray_run_last_checkpoint_timestamp_seconds",
        "When the latest complete checkpoint completed (Unix time)",
    ),
)
PHASES = (PENDING, RUNNING, RESUMING, SUSPENDED, SUCCEEDED, FAILED)

_runs: dict[tuple[str, str], RunFigures] = {}
_runs_lock = threading.Lock()


def observe_run(namespace: str, name: str, figures: RunFigures) -> None:
    with _runs_lock:
        _runs[namespace, name] = figures


def set_phase(namespace: str, name: str, phase: str) -> None:
    """Only the phase is known (a run refused as bad input): its other figures are dropped."""
    observe_run(namespace, name, RunFigures(phase=phase))


def known_runs() -> int:
    with _runs_lock:
        return len(_runs)


def forget_run(namespace: str, name: str) -> None:
    with _runs_lock:
        _runs.pop((namespace, name), None)


class _RunCollector(Collector):
    """Runs by phase, and each run's figures, read at scrape time from what reconciles observed."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with _runs_lock:
            runs = dict(_runs)
        counts = Tally(figures.phase for figures in runs.values())
        by_phase = GaugeMetricFamily("spotray_trainingruns", "TrainingRuns by phase", labels=["phase"])
        for phase in PHASES:
            by_phase.add_metric([phase], counts.get(phase, 0))
        yield by_phase
        phase_of = GaugeMetricFamily("spotray_run_phase", "1 for the run's phase", labels=["namespace", "run", "phase"])
        for (namespace, name), figures in sorted(runs.items()):
            phase_of.add_metric([namespace, name, figures.phase], 1)
        yield phase_of
        for attribute, metric, help_text in RUN_GAUGES:
            family = GaugeMetricFamily(metric, help_text, labels=["namespace", "run"])
            for (namespace, name), figures in sorted(runs.items()):
                value = getattr(figures, attribute)
                if value is not None:
                    family.add_metric([namespace, name], float(value))
            yield family


REGISTRY.register(_RunCollector())


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from other pods
    start_http_server(port, addr=address, registry=REGISTRY)
