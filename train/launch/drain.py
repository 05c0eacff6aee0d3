"""``python -m spotray.train.launch.drain``: a Ray pod's preStop hook for spot notices.

Kubernetes runs the hook before it sends SIGTERM, and waits for it within the pod's grace period.
The hook drains this pod's Ray node as a preemption (what ``ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION`` does), which Ray Train turns into a notice for the training workers:
they take an emergency checkpoint, wait until it is complete in S3, and stop. The hook then waits
until no Ray Train worker is left on this node, or the workers on it say that their checkpoint is
safe and their group goes on without them (an elastic run, or one with a spare worker pod:
train/processes/drain_handshake.py), or the deadline nears, so the SIGTERM that follows does not cut
the checkpoint short, and a group that goes on does not train on a leaving node longer than it must.

The head pod's hook (``--whole-cluster``): a notice on the head's node (a head on spot capacity, a
node drained for an upgrade) ends the whole Ray cluster, its GCS and the job's driver with it. Its
container's first process is KubeRay's shell, which need not pass SIGTERM on to Ray, so without the
hook the job learns nothing until the grace period ends and the head is killed: the steps since the
last checkpoint are lost. The hook drains every node as a preemption and waits until no Ray Train
worker is left in the cluster (their emergency checkpoint taken) or the deadline nears.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from spotray.contract.extras import extra_required
from spotray.train.launch.ray_drain import alive_nodes, drain_nodes
from spotray.train.processes.drain_handshake import checkpointed, checkpointed_marker

with extra_required("ray"):
    import ray

log = logging.getLogger("spotray.drain")
# Leave the last seconds of the grace period to Kubernetes' SIGTERM and Ray's own shutdown.
_MARGIN_S = 3.0
# The workers' marker is a file on this node, looked at often: once their checkpoint is safe, every
# moment the node stays is a moment before Ray Train restarts the group elsewhere. The GCS (the count
# of workers left) is asked less often.
_MARKER_POLL_S = 0.2
_WORKERS_POLL_S = 1.0


def training_workers_on(node_id: str | None) -> int:
    """Live Ray Train worker actors on the node (None: anywhere in the cluster), from the GCS (a worker
    pod has no dashboard of its own)."""
    actors = ray._private.state.actors()  # the GCS view: the state API would need the dashboard
    return sum(
        1
        for actor in actors.values()
        if actor.get("State") == "ALIVE"
        and (node_id is None or actor.get("Address", {}).get("NodeID") == node_id)
        and "TrainWorker" in (actor.get("ActorClassName") or "")
    )


def no_workers_left(node_id: str | None, started: float) -> bool:
    """No Ray Train worker is left on the node (None: in the cluster), or the GCS cannot say: the hook
    must never fail the pod's shutdown, nor hold it on a question it cannot ask."""
    where = "on this node" if node_id is not None else "in the cluster"
    try:
        remaining = training_workers_on(node_id)
    except Exception as error:  # noqa: BLE001 - see the docstring
        log.warning("cannot list the actors %s (%s); not waiting", where, error)
        return True
    if remaining == 0:
        log.info("no training worker left %s after %.1f s", where, time.monotonic() - started)
        return True
    return False


def raylet_pids(node_id: str, proc: Path = Path("/proc")) -> list[int]:
    """The raylet of the Ray node ``node_id`` (its command line names the node), from ``proc``."""
    wanted = f"--node_id={node_id}".encode()
    pids = []
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # it exited meanwhile, or is not ours to read
            continue
        if args and args[0].endswith(b"/raylet") and wanted in args:
            pids.append(int(cmdline.parent.name))
    return pids


def stop_raylet(node_id: str, proc: Path = Path("/proc")) -> bool:
    """SIGTERM this node's raylet: it unregisters from Ray's GCS and the node is dead at once.

    Left to the kubelet's SIGTERM, the node might live on until the grace period ends: the Ray
    container's first process is KubeRay's ``bash -c "ulimit ...; ray start --block"``, and a shell
    as a container's PID 1 need not pass SIGTERM on. A raylet that just vanishes is marked dead only
    after its heartbeats are missed (about 30 s), and Ray Train restarts the smaller group after that.
    """
    pids = raylet_pids(node_id, proc)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return bool(pids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deadline-seconds", type=int, required=True, help="the pod's termination grace period")
    parser.add_argument(
        "--node-ip-address",
        help="the Ray node to drain, by its address (default: this machine's; local mode runs several on one)",
    )
    parser.add_argument(
        "--whole-cluster",
        action="store_true",
        help="the head pod's hook: drain every node, and wait until no training worker is left in the cluster",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spotray.drain: %(message)s")
    started = time.monotonic()
    # In a pod, "auto" finds the node's own Ray; RAY_ADDRESS wins where it is set (tests, local mode).
    ray.init(
        address=os.environ.get("RAY_ADDRESS", "auto"),
        logging_level=logging.WARNING,
        _node_ip_address=args.node_ip_address,
    )
    if args.whole_cluster:
        return drain_whole_cluster(args.deadline_seconds, started)
    node_id = ray.get_runtime_context().get_node_id()
    accepted = drain_nodes([node_id], "spotray: pod preStop (spot notice)", args.deadline_seconds)
    log.info("drain of node %s %s", node_id, "accepted" if accepted else "refused")
    workers_asked_at = -_WORKERS_POLL_S
    while time.monotonic() - started < args.deadline_seconds - _MARGIN_S:
        if time.monotonic() - workers_asked_at >= _WORKERS_POLL_S:
            workers_asked_at = time.monotonic()
            if no_workers_left(node_id, started):
                return 0
        if checkpointed(node_id):
            checkpointed_marker(node_id).unlink(missing_ok=True)
            stopped = stop_raylet(node_id)
            log.info(
                "the workers on this node have a complete emergency checkpoint and their group goes on "
                "without them, after %.1f s: %s",
                time.monotonic() - started,
                "SIGTERM to this node's raylet, which leaves Ray at once" if stopped else "no raylet found to stop",
            )
            return 0
        time.sleep(_MARKER_POLL_S)
    log.warning("deadline near with training workers still on this node; letting Kubernetes stop the pod")
    return 0


def drain_whole_cluster(deadline_seconds: int, started: float) -> int:
    """The head's hook: every node drained as a preemption, then wait until the cluster runs no Ray
    Train worker (they took their emergency checkpoint and stopped) or the deadline nears."""
    nodes = alive_nodes()
    accepted = drain_nodes(nodes, "spotray: head pod preStop (spot notice)", deadline_seconds)
    log.info("drain of %d of %d nodes accepted", accepted, len(nodes))
    while time.monotonic() - started < deadline_seconds - _MARGIN_S:
        if no_workers_left(None, started):
            return 0
        time.sleep(_WORKERS_POLL_S)
    log.warning("deadline near with training workers still in the cluster; letting Kubernetes stop the head")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
