"""``spotray logs RUN``: an attempt's job logs, from Ray's jobs API on the attempt's Ray head.

The controller runs attempt N as the RayJob ``<run>-a<N>``; KubeRay records the job's ID and the
head's dashboard address in the RayJob's status. The dashboard is a cluster-internal service, so
from a laptop it needs a port-forward; the error says exactly which.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from spotray.contract.attempts import EXIT_OK, OUTCOME_INTERRUPTED, OUTCOME_PREEMPTED
from spotray.contract.names import rayjob_name
from spotray.contract.status import RunStatus
from spotray.errors import CommandFailedError, NotFoundError

if TYPE_CHECKING:
    from spotray.kube import ClusterConnection

DASHBOARD_PORT = 8265
TIMEOUT_SECONDS = 10.0


def head_service(ray_job: dict[str, Any]) -> str:
    """The Ray head's Service, for the port-forward hint: the dashboard URL's first DNS label."""
    status = ray_job.get("status") or {}
    url = str(status.get("dashboardURL") or "")
    host = url.split("://", 1)[-1].split(".", 1)[0].split(":", 1)[0]
    return host or f"{status.get('rayClusterName', '<raycluster>')}-head-svc"


def dashboard_base(url: str) -> str:
    url = url.rstrip("/")
    return url if "://" in url else f"http://{url}"


def fetch_job_logs(dashboard: str, job_id: str) -> str:
    """``GET {dashboard}/api/jobs/{job_id}/logs``: the driver's whole log so far."""
    with urllib.request.urlopen(f"{dashboard}/api/jobs/{job_id}/logs", timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - http(s) only, built above
        return str(json.loads(response.read())["logs"])


def logs_command(cluster: ClusterConnection, run: str, attempt: int | None, dashboard: str | None) -> int:
    namespace = cluster.namespace
    if attempt is None:
        attempt = RunStatus.of(cluster.get_run(run)).attempt or 0
        if not attempt:
            raise NotFoundError(
                f"TrainingRun {namespace}/{run} has not started an attempt yet",
                f"wait for it to start: spotray watch {run} -n {namespace}",
            )
    job_name = rayjob_name(run, attempt)
    try:
        job = cluster.get_ray_job(job_name)
    except NotFoundError:
        ended = RunStatus.of(cluster.get_run(run)).attempt_entry(attempt).outcome
        if ended not in (OUTCOME_PREEMPTED, OUTCOME_INTERRUPTED):
            raise
        raise NotFoundError(
            f"attempt {attempt} of {namespace}/{run} ended {ended}, and its RayJob {job_name} was deleted with "
            "its Ray cluster, so that the next attempt had its capacity; its logs went with it",
            f"`spotray status {run} -n {namespace}` says how it ended; a failed attempt's cluster (and logs) "
            "stays for the chart's controller.rayJobTTLSeconds",
        ) from None
    job_id = (job.get("status") or {}).get("jobId")
    if not job_id:
        raise NotFoundError(
            f"RayJob {namespace}/{job_name} has not submitted its job yet",
            f"its Ray cluster is still starting; `kubectl get rayjob {job_name} -n {namespace}` shows how far it got",
        )
    base = dashboard_base(dashboard or (job.get("status") or {}).get("dashboardURL") or "")
    try:
        sys.stdout.write(fetch_job_logs(base, job_id))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise NotFoundError(
                f"the Ray dashboard at {base} does not know job {job_id} of {job_name}",
                "its Ray cluster has been replaced or deleted since; a finished attempt's logs go with its cluster",
            ) from None
        raise CommandFailedError(
            f"the Ray dashboard at {base} answered {error.code} {error.reason}", "try again in a moment"
        ) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        service = head_service(job)
        raise CommandFailedError(
            f"could not read the logs of {job_name} from the Ray dashboard at {base} ({error}); "
            "it is usually reachable only inside the cluster",
            f"forward it: `kubectl port-forward -n {namespace} svc/{service} {DASHBOARD_PORT}:{DASHBOARD_PORT}`, "
            f"then: spotray logs {run} -n {namespace} --attempt {attempt} --dashboard http://localhost:{DASHBOARD_PORT}",
        ) from None
    sys.stdout.flush()
    return EXIT_OK
