"""The chart's monitoring options (templates/monitoring.yaml): a ServiceMonitor or PodMonitor for the
controller's /metrics, and the Grafana dashboard as a ConfigMap, whose every query names only metrics
the controller serves (issue 72)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from spotray.controller import metrics
from tests.unit.test_chart import (
    CHART,
    NAMESPACE,
    helm,  # noqa: F401 - the fixture that builds helm, used by name below
    only,
    refused,
    render,
)

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("helm")]

DASHBOARD = CHART / "dashboards" / "spotray.json"


def served_metric_names() -> set[str]:
    """Every series name /metrics can hold: counters with _total, histograms with their parts."""
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
    return names


def test_off_by_default() -> None:
    kinds = {o["kind"] for o in render("defaults.yaml")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "ConfigMap"}


def test_the_monitors_select_the_controllers_metrics_port() -> None:
    objects = render("monitoring.yaml")
    service = only(objects, "Service")
    monitor = only(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert any(port["name"] == "metrics" for port in service["spec"]["ports"])

    pods = only(objects, "Deployment")["spec"]["template"]
    pod_monitor = only(objects, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in pods["spec"]["containers"][0]["ports"]}


def test_a_service_monitor_without_the_service_is_refused_with_the_fix() -> None:
    stderr = refused("controller.metrics.serviceMonitor.enabled=true", "controller.metrics.service.enabled=false")
    assert "needs controller.metrics.service.enabled" in stderr
    assert "podMonitor" in stderr


def test_the_dashboard_configmap_holds_the_dashboard_for_grafanas_sidecar() -> None:
    config_map = only(render("monitoring.yaml"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["spotray.json"]) == json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[str]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def test_every_dashboard_query_names_only_metrics_the_controller_serves() -> None:
    served = served_metric_names()
    queries = dashboard_queries()
    assert len(queries) >= 10
    for query in queries:
        named = set(re.findall(r"\bspotray_[a-z_]+\b", query))
        assert named, query
        assert named <= served, (query, sorted(named - served))
