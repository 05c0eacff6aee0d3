"""``python -m spotray.train.launch.drain``: a Ray worker pod's preStop hook for spot notices.

Kubernetes runs the hook before it sends SIGTERM, and waits for it within the pod's grace period.
The hook drains this pod's Ray node as a preemption (what ``ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION`` does), which Ray Train turns into a notice for the training workers:
they take an emergency checkpoint, wait until it is complete in S3, and stop. The hook then waits
until no Ray Train worker is left on this node (or the deadline nears), so the SIGTERM that follows
does not cut the checkpoint short.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from spotray.contract.extras import extra_required
from spotray.train.launch.launcher import drain_nodes

with extra_required("ray"):
    import ray

log = logging.getLogger("spotray.drain")
# Leave the last seconds of the grace period to Kubernetes' SIGTERM and Ray's own shutdown.
_MARGIN_S = 3.0
_POLL_S = 1.0


def training_workers_on(node_id: str) -> int:
    """Live Ray Train worker actors on the node, from the GCS (a worker pod has no dashboard of its own)."""
    actors = ray._private.state.actors()  # the GCS view: the state API would need the dashboard
    return sum(
        1
        for actor in actors.values()
        if actor.get("State") == "ALIVE"
        and actor.get("Address", {}).get("NodeID") == node_id
        and "TrainWorker" in (actor.get("ActorClassName") or "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deadline-seconds", type=int, required=True, help="the pod's termination grace period")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spotray.drain: %(message)s")
    started = time.monotonic()
    # In a pod, "auto" finds the node's own Ray; RAY_ADDRESS wins where it is set (tests, local mode).
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level=logging.WARNING)
    node_id = ray.get_runtime_context().get_node_id()
    accepted = drain_nodes([node_id], "spotray: pod preStop (spot notice)", args.deadline_seconds)
    log.info("drain of node %s %s", node_id, "accepted" if accepted else "refused")
    while time.monotonic() - started < args.deadline_seconds - _MARGIN_S:
        try:
            remaining = training_workers_on(node_id)
        except Exception as error:  # noqa: BLE001 - the hook must never fail the pod's shutdown
            log.warning("cannot list this node's actors (%s); not waiting", error)
            return 0
        if remaining == 0:
            log.info("no training worker left on this node after %.1f s", time.monotonic() - started)
            return 0
        time.sleep(_POLL_S)
    log.warning("deadline near with training workers still on this node; letting Kubernetes stop the pod")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
