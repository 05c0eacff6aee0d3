"""What one decision knows: the run, its state, the current attempt's RayJob and the run's RayCluster
as read, and what the job wrote (``Observation``), gathered by controller/reconcile.py or spotray/local/local_run.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from spotray.contract.attempts import (
    AttemptRecords,
)
from spotray.contract.names import (
    DEPLOYMENT_ENDED,
    DEPLOYMENT_SUSPENDED,
    JOB_ENDED,
    JOB_PENDING,
)
from spotray.contract.spec import TrainingRun
from spotray.decisions.run_state import RunState

# An attempt ended and its records cannot be read: the run waits (no budget spent) and after this
# long shows a StorageUnreachable condition; the controller's SPOTRAY_STORAGE_PATIENCE_SECONDS
# (controller/config.py) sets it, and the chart's controller.storagePatienceSeconds repeats it
# (tests/unit/test_deploy_files.py checks).
STORAGE_PATIENCE_SECONDS = 600
# Ray's job supervisor says how the entrypoint ended in the job's message, which KubeRay copies into
# the RayJob's status.message: "Job entrypoint command failed with exit code N, last available logs ...".
RAY_EXIT_CODE = re.compile(r"^Job entrypoint command failed with exit code (-?\d+)\b")
# Ray's job manager's words when the Ray job failed before its entrypoint ran (its supervisor actor
# could not be scheduled, died, did not start in time, or was lost: ray/dashboard/modules/job/
# job_manager.py), which KubeRay copies the same way: a fault of Ray's cluster, never of the training code.
RAY_CLUSTER_FAULT = re.compile(
    r"^(Job supervisor actor (could not be scheduled|died|failed to start within)"
    r"|Unexpected error occurred: failed to get job supervisor)"
)
# A job that a node loss ends fails within a minute or two of it (the head's pod gone, KubeRay
# notices); one that fails later outlived the loss: Ray Train restarted its workers, or an elastic
# group went on smaller. Its failure is then the code's, and spends the failure budget.
DISRUPTION_CAUSE_WINDOW_S = 300
# How the pod watcher's note (controller/disruptions.py) begins when the disrupted pod was the Ray
# head's: the head runs on on-demand nodes, so a notice that reached it was an eviction (a drain,
# maintenance), never a spot reclaim, whatever nodes the workers ran on.
HEAD_POD_NOTE = "the Ray head's pod "
# How stale a running attempt's progress is before the controller reads its records while its RayJob
# runs (controller/reconcile.py): a training job reports every few seconds, so only a stopped one costs reads.
STALLED_PROGRESS_S = 30.0


@dataclass(frozen=True)
class RayJobView:
    """What the lifecycle needs from the current attempt's RayJob (None when it does not exist)."""

    job_status: str | None  # status.jobStatus: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    deployment_status: str | None  # status.jobDeploymentStatus: Initializing, Running, Complete, Failed, ...
    message: str = ""
    end_time: datetime | None = None
    disruption: str | None = None  # set by the pod watcher: "pod P on node N: reason"
    disrupted_at: datetime | None = None  # when that pod was disrupted, where the watcher knew
    owner_uid: str | None = None  # the TrainingRun that owns it (its controller owner reference)
    exit_code: int | None = None  # the driver's, where known first-hand (local mode)
    suspended: bool = False  # spec.suspend: made so for a Kueue queue, or suspended by Kueue to evict it

    @property
    def head_disrupted(self) -> bool:
        """The pod the watcher saw disrupted was the Ray head's (``HEAD_POD_NOTE``)."""
        return bool(self.disruption and self.disruption.startswith(HEAD_POD_NOTE))

    @property
    def driver_exit_code(self) -> int | None:
        """The driver's exit code: known first-hand, or as Ray's job supervisor wrote it in the message."""
        if self.exit_code is not None:
            return self.exit_code
        found = RAY_EXIT_CODE.match(self.message)
        return int(found.group(1)) if found else None

    @property
    def ray_cluster_fault(self) -> bool:
        """Ray's job supervisor failed before the entrypoint ran (``RAY_CLUSTER_FAULT``): Ray's cluster, not the job."""
        return RAY_CLUSTER_FAULT.match(self.message) is not None

    @property
    def lost_node_ended_it(self) -> bool:
        """A pod's node was lost, and not so long before the job ended that the job went on without it.

        With no time to compare (an annotation from an older controller, local mode), the report stands.
        """
        if not self.disruption:
            return False
        if self.disrupted_at is None or self.end_time is None:
            return True
        return self.disrupted_at >= self.end_time - timedelta(seconds=DISRUPTION_CAUSE_WINDOW_S)

    @property
    def finished(self) -> bool:
        return self.deployment_status in DEPLOYMENT_ENDED or self.job_status in JOB_ENDED

    @property
    def queued(self) -> bool:
        """Suspended and not finished: waiting for a queue to admit it (or evicted by it)."""
        suspending = self.deployment_status in DEPLOYMENT_SUSPENDED
        # KubeRay's JobStatusNew is "": the job not submitted (again) since the cluster went.
        return not self.finished and (suspending or (self.suspended and not self.job_status))

    @property
    def submitted(self) -> bool:
        """The job was handed to Ray, so it may have written progress; not still waiting for its cluster."""
        cluster_starting = self.deployment_status in (None, "", "New", "Initializing")
        return self.finished or not cluster_starting or self.job_status not in (None, "", JOB_PENDING)


@dataclass(frozen=True)
class PodsWaiting:
    """Why the pods of an attempt that has not started wait, as their status says (controller/pod_waits.py).

    ``capacity``: the scheduler cannot place a pod now (no node with room, a node pool scaling up, a
    spot pool without nodes): infrastructure, waited for without spending a budget
    (spotray/decisions/capacity_wait.py). ``stuck``: a placed pod that cannot start wherever it goes (an
    image that cannot be pulled, a missing Secret or key): bad input, ended at the start deadline in its
    own words. ``unreadable``: the pods could not be listed; no deadline ends an attempt on that.
    """

    capacity: str = ""
    stuck: str = ""
    unreadable: str = ""


@dataclass(frozen=True)
class RayClusterView:
    """The run's RayCluster its last attempt ran on, as read (``ray_cluster_per_run``)."""

    name: str
    head_lost: str | None = None  # set by the pod watcher: "pod P on node N: reason"
    owner_uid: str | None = None  # the TrainingRun that owns it
    spare_moved: str | None = None  # the last idle spare moved off a worker's node (controller/spare_placement.py)
    shape: str | None = None  # the hash of the spec it was made from (controller/rayjob.py ``ray_cluster_shape``)


@dataclass(frozen=True)
class Observation:
    """Every fact one decision needs, gathered before it (controller/reconcile.py)."""

    run: TrainingRun
    state: RunState
    job: RayJobView | None
    # What the job wrote about the current attempt; None: the store could not be read (unknown,
    # which is not "nothing written": the decision waits for it).
    records: AttemptRecords | None = field(default_factory=AttemptRecords)
    run_uid: str | None = None  # the TrainingRun's metadata.uid: a RayJob owned by another UID is not ours
    storage_error: str = ""
    # The store answered and refused the controller, which has no credentials it may use for this run
    # (it names no Secret): the records will never be readable, so the RayJob's facts alone decide.
    storage_refused: bool = False
    settle_seconds: float = 5.0
    # An attempt whose Ray cluster has not started this long after it began ends as a failure
    # (pods refused by admission, a quota, no capacity): it must never wait for ever. 0: no deadline.
    start_deadline_seconds: float = 0.0
    # What the pods of an attempt that has not started wait for; None: not read (it runs, local mode).
    pods_waiting: PodsWaiting | None = None
    # How long an ended attempt's records may stay unreadable before the run shows StorageUnreachable.
    storage_patience_seconds: float = STORAGE_PATIENCE_SECONDS
    # One RayCluster per run, kept across attempts (controller/config.py ``ray_cluster_per_run``), and
    # the one the last attempt ran on as read (None: it does not exist, or there is none yet).
    ray_cluster_per_run: bool = False
    ray_cluster: RayClusterView | None = None
    # The shape of the RayCluster the run's spec makes now, for workers on spot and on on-demand nodes;
    # a kept cluster of another shape than the next attempt's is replaced.
    ray_cluster_shapes: Mapping[str, str] = field(default_factory=dict)
    # How long a suspended attempt's RayJob outlives its kept cluster's deletion (``_plan``): the workers'
    # grace period, in which the nodes' preStop drains give the emergency checkpoint, and a margin.
    suspend_checkpoint_seconds: float = 0.0
