"""Prometheus on the test bed: the real server, built from its Go module by `testbed/build.sh
prometheus` (static targets only), run as one of a Testbed's host processes, scraping what the test
names every second on loopback (docs/testbed.md, "Prometheus").

A real install finds the controller through the chart's ServiceMonitor or PodMonitor (Prometheus
Operator); here the controller is a host process and Prometheus is given its address. What is
tested is what a user's Prometheus and Grafana do with it: the series the controller serves, and
the chart's dashboard queries (charts/spotray/dashboards/spotray.json) evaluated by PromQL itself.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from spotray.train.storage.local_s3 import free_ports
from testbed.cluster import Testbed, answers_ok, wait_until
from testbed.nodes import CACHE, versions

SCRAPE_INTERVAL = "1s"


def prometheus_binary() -> Path:
    path = CACHE / f"prometheus-{versions()['PROMETHEUS_VERSION']}" / "bin" / "prometheus"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run testbed/build.sh prometheus (make test-campaign does)")
    return path


class Prometheus:
    """Prometheus scraping ``targets`` (host:port) as job ``spotray``; stopped with the test bed."""

    def __init__(self, testbed: Testbed, targets: list[str]) -> None:
        self.testbed = testbed
        self.targets = targets
        self.workdir = testbed.workdir / "prometheus"
        self.port = 0

    def start(self, timeout: float = 60) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": "spotray", "static_configs": [{"targets": self.targets}]}],
        }
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        [self.port] = free_ports(1)
        self.testbed._spawn(  # one of the test bed's processes: killed with it
            "prometheus",
            [
                str(prometheus_binary()),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
        )
        wait_until("Prometheus ready", self.ready, timeout=timeout)
        return self

    def ready(self) -> bool:
        self.testbed._check_alive()  # says why, with the log's tail, if it exited
        return answers_ok(f"http://127.0.0.1:{self.port}/-/ready")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) PromQL gives for ``expr`` now."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise ValueError(f"Prometheus refused {expr!r}: {answer}")
        data = answer["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets_up(self) -> bool:
        """Every target scraped successfully at least once (``up`` is 1 for each)."""
        return len([s for s in self.query('up{job="spotray"}') if s["value"][1] == "1"]) == len(self.targets)
