"""``spotray logs RUN``: an attempt's job logs, through the API server or from Ray's jobs API.

The controller runs attempt N as the RayJob ``<run>-a<N>``. In K8sJobMode (the chart's default)
KubeRay runs a submitter pod that submits the job and prints the driver's log until it ends: its log,
read through the API server as ``kubectl logs`` does, needs no port-forward and no token, and
``-f`` follows it from attempt to attempt. Otherwise (``--dashboard``, or HTTPMode with no submitter
pod) the log comes from Ray's jobs API on the head, whose address KubeRay records in the RayJob's
status: a cluster-internal service, so from a laptop it needs a port-forward, and the error says
exactly which. With Ray's token auth on (the chart's default) the dashboard also needs the
cluster's token in RAY_AUTH_TOKEN; the CLI never reads a Secret itself, and the error says which
one holds the token and how to read it."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spotray.cli.exit_codes import CommandFailedError, NotFoundError
from spotray.contract.attempts import EXIT_OK, OUTCOME_INTERRUPTED, OUTCOME_PREEMPTED
from spotray.contract.errors import SpotrayError
from spotray.contract.names import TERMINAL_PHASES, rayjob_name
from spotray.contract.status import RunStatus

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection

DASHBOARD_PORT = 8265
# What Ray's own clients read the token from (KubeRay sets it in the cluster's containers).
RAY_TOKEN_ENV = "RAY_AUTH_TOKEN"  # noqa: S105 - the variable's name, not a token
TIMEOUT_SECONDS = 10.0
# The container of the K8sJobMode submitter pod (controller/rayjob.py): it submits the job and prints
# the driver's log until the job ends (spotray/train/launch/submitter.py).
SUBMITTER_CONTAINER = "ray-job-submitter"
FOLLOW_POLL_SECONDS = 2.0


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


def logs_command(
    cluster: ClusterConnection,
    run: str,
    attempt: int | None,
    dashboard: str | None,
    *,
    follow: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print an attempt's driver log: its submitter pod's log through the API server (no port-forward,
    no token), or, given ``dashboard`` or without a submitter pod (HTTPMode), Ray's jobs API on the head.
    ``follow``: until the attempt ends, or, without ``attempt``, from attempt to attempt until the run ends."""
    if follow:
        if dashboard:
            raise SpotrayError(
                "--follow reads the submitter pod's log through the Kubernetes API, not the Ray dashboard",
                "drop --dashboard (or --follow)",
            )
        return follow_logs(cluster, run, attempt, sleep)
    namespace = cluster.namespace
    if attempt is None:
        attempt = RunStatus.of(cluster.get_run(run)).attempt or 0
        if not attempt:
            raise NotFoundError(
                f"TrainingRun {namespace}/{run} has not started an attempt yet",
                f"wait for it to start: spotray logs {run} -n {namespace} -f",
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
    submitter = None if dashboard else cluster.submitter_pod(job_name)
    if submitter is not None:
        for chunk in cluster.pod_log(submitter["metadata"]["name"], SUBMITTER_CONTAINER, follow=False):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return EXIT_OK
    return dashboard_logs(job, (run, namespace, attempt, dashboard))


def follow_logs(cluster: ClusterConnection, run: str, pinned: int | None, sleep: Callable[[float], None]) -> int:
    """``spotray logs -f``: each attempt's submitter pod's log as it comes, through the API server. A pod
    that has not started is waited for; when the run moves to a new attempt (unless ``pinned``), its log
    follows, after a line on stderr that says how the last one ended. Returns when the followed attempt
    (``pinned``) or the run has ended and its log was printed to its end."""
    namespace = cluster.namespace
    attempt, printed = pinned or 0, set()  # printed: the pods whose log was read to the container's end
    while True:
        status = RunStatus.of(cluster.get_run(run))
        if pinned is None and (status.attempt or 0) > attempt:
            if attempt:
                ended = status.attempt_entry(attempt)
                note(f"attempt {attempt} ended {ended.outcome or '?'} ({ended.reason or 'no reason yet'})")
            attempt = status.attempt or 0
            note(f"following attempt {attempt} of {namespace}/{run}")
        pod = cluster.submitter_pod(rayjob_name(run, attempt)) if attempt else None
        if pod is None and attempt:
            refuse_http_mode(cluster, run, attempt)
        name = str(pod["metadata"]["name"]) if pod else ""
        if pod is not None and name not in printed:
            try:
                for chunk in cluster.pod_log(name, SUBMITTER_CONTAINER, follow=True):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                printed.add(name)
            except NotFoundError:
                pass  # not started yet, or deleted since it was listed: the next round says which
        if (pod is None or name in printed) and (
            status.phase in TERMINAL_PHASES or (pinned is not None and status.attempt_entry(pinned).end_time)
        ):
            return EXIT_OK
        sleep(FOLLOW_POLL_SECONDS)


def refuse_http_mode(cluster: ClusterConnection, run: str, attempt: int) -> None:
    """An attempt whose RayJob submits over HTTP (HTTPMode) has no submitter pod: nothing to follow."""
    try:
        job = cluster.get_ray_job(rayjob_name(run, attempt))
    except NotFoundError:
        return  # not created yet, or gone with its attempt: the next round looks again
    if (job.get("spec") or {}).get("submissionMode") == "HTTPMode":
        raise SpotrayError(
            f"RayJob {cluster.namespace}/{rayjob_name(run, attempt)} submits its job over HTTP (the chart's "
            "controller.submissionMode HTTPMode): no pod holds its log, so there is nothing to follow",
            f"read it from Ray's jobs API: spotray logs {run} -n {cluster.namespace} --dashboard URL "
            "(`spotray logs --help` says how to reach the dashboard)",
        )


def note(text: str) -> None:
    sys.stderr.write(f"spotray: {text}\n")
    sys.stderr.flush()


def dashboard_logs(job: dict[str, Any], command: tuple[str, str, int, str | None]) -> int:
    """The driver's log from Ray's jobs API on the attempt's head (``command``: run, namespace, attempt, and
    the dashboard to ask, default the RayJob's)."""
    run, namespace, attempt, dashboard = command
    job_name = rayjob_name(run, attempt)
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
            raise token_refusal(error.code, base, job, token_sent=bool(token), command=command) from None
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
