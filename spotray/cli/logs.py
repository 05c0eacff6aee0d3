"""``spotray logs RUN``: an attempt's job logs, from Ray's jobs API on the attempt's Ray head.

The controller runs attempt N as the RayJob ``<run>-a<N>``; KubeRay records the job's ID and the
head's dashboard address in the RayJob's status. The dashboard is a cluster-internal service, so
from a laptop it needs a port-forward; the error says exactly which. With Ray's token auth on (the
chart's default) it also needs the cluster's token in RAY_AUTH_TOKEN; the CLI never reads a Secret
itself, and the error says which one holds the token and how to read it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from spotray.cli.exit_codes import CommandFailedError, NotFoundError
from spotray.contract.attempts import EXIT_OK, OUTCOME_INTERRUPTED, OUTCOME_PREEMPTED
from spotray.contract.names import rayjob_name
from spotray.contract.status import RunStatus

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection

DASHBOARD_PORT = 8265
# What Ray's own clients read the token from (KubeRay sets it in the cluster's containers).
RAY_TOKEN_ENV = "RAY_AUTH_TOKEN"  # noqa: S105 - the variable's name, not a token
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


def ray_token_secret_name(cluster: str) -> str:
    """The Secret in which KubeRay keeps a RayCluster's token (authOptions mode token, no secretName):
    the cluster's name as KubeRay's ``utils.CheckName`` shortens it (its last 50 characters, a leading
    digit or punctuation made ``r``)."""
    name = cluster[-50:]
    return "r" + name[1:] if name and not name[0].isalpha() else name


def fetch_job_logs(dashboard: str, job_id: str, token: str | None = None) -> str:
    """``GET {dashboard}/api/jobs/{job_id}/logs``: the driver's whole log so far.

    ``token``: the Ray cluster's token, for a cluster with Ray's token auth on (Ray 2.52+).
    """
    request = urllib.request.Request(f"{dashboard}/api/jobs/{job_id}/logs")  # noqa: S310 - http(s) only, built above
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - http(s) only, built above
        return str(json.loads(response.read())["logs"])


def token_refusal(
    code: int, base: str, ray_job: dict[str, Any], *, token_sent: bool, command: tuple[str, str, int, str | None]
) -> CommandFailedError:
    """The error for a dashboard that wants Ray's token: which Secret holds it, and the command that reads it."""
    run, namespace, attempt, dashboard = command
    secret = ray_token_secret_name(str((ray_job.get("status") or {}).get("rayClusterName") or "<raycluster>"))
    why = f"refused the token in {RAY_TOKEN_ENV}" if token_sent else f"needs its token ({RAY_TOKEN_ENV} is not set)"
    read = f"kubectl get secret {secret} -n {namespace} -o jsonpath='{{.data.auth_token}}' | base64 -d"
    again = f"spotray logs {run} -n {namespace} --attempt {attempt}" + (
        f" --dashboard {dashboard}" if dashboard else ""
    )
    return CommandFailedError(
        f"the Ray dashboard at {base} answered {code}: Ray's token auth is on, and it {why}",
        f"the token is in the Secret {secret} (KubeRay's, made with the cluster): {RAY_TOKEN_ENV}=$({read}) {again}",
    )


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
    token = os.environ.get(RAY_TOKEN_ENV, "").strip() or None
    try:
        sys.stdout.write(fetch_job_logs(base, job_id, token))
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise token_refusal(
                error.code, base, job, token_sent=bool(token), command=(run, namespace, attempt, dashboard)
            ) from None
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
