"""``python -m spotray.train.launch.submitter``: the command of a RayJob's K8sJobMode submitter pod.

KubeRay's own submitter runs ``bash -c`` on one line with the entrypoint pasted in and the runtime
env in double quotes: ``$(...)``, backticks and ``$VAR`` anywhere in the spec ran in the submitter
pod, and the entrypoint was split and expanded there before Ray's job manager ran it through its
own shell. This command takes both as argv elements (controller/rayjob.py) and hands them to the
job API as they are, so the entrypoint meets one shell, Ray's, as in HTTPMode.

Otherwise it does what KubeRay's line does: submit once per submission id (a retried submitter pod
finds the job there and only follows it, KubeRay issue 2154), then print the job's logs until it
ends. KubeRay sets RAY_DASHBOARD_ADDRESS (host:port) and RAY_JOB_SUBMISSION_ID in the pod.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from spotray.contract.extras import extra_required

with extra_required("ray"):
    from ray.job_submission import JobSubmissionClient

log = logging.getLogger("spotray.submitter")


def dashboard_url(address: str) -> str:
    """KubeRay's dashboard address has no scheme; it adds ``http://`` itself (common/job.go)."""
    return address if "://" in address else f"http://{address}"


def submit_once(client: JobSubmissionClient, submission_id: str, entrypoint: str, runtime_env: dict[str, Any]) -> None:
    try:
        client.get_job_info(submission_id)
    except RuntimeError:  # not there yet (or the status call failed: a second submit is refused by Ray)
        client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env)
        log.info("job %s submitted", submission_id)
    else:
        log.info("job %s was submitted before (this pod is a retry): following it", submission_id)


async def follow_logs(client: JobSubmissionClient, submission_id: str) -> None:
    async for lines in client.tail_job_logs(submission_id):
        sys.stdout.write(lines)
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-env-json", required=True, help="the job's runtime env, as JSON")
    parser.add_argument("entrypoint", help="the job's entrypoint, a shell command that Ray's job manager runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spotray.submitter: %(message)s")
    submission_id = os.environ["RAY_JOB_SUBMISSION_ID"]
    client = JobSubmissionClient(dashboard_url(os.environ["RAY_DASHBOARD_ADDRESS"]))
    submit_once(client, submission_id, args.entrypoint, json.loads(args.runtime_env_json))
    asyncio.run(follow_logs(client, submission_id))
    info = client.get_job_info(submission_id)
    log.info("job %s ended: %s %s", submission_id, info.status, info.message or "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
