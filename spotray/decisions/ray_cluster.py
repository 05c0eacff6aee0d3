"""Which RayCluster the next attempt runs on when the controller keeps one per run
(controller.rayClusterPerRun): the last one while it is usable, else the next generation.
"""

from __future__ import annotations

from spotray.contract.names import (
    ray_cluster_generation,
    ray_cluster_name,
)
from spotray.decisions.attempt_end import interruptions_in_a_row
from spotray.decisions.observation import Observation, RayClusterView
from spotray.decisions.run_state import RunState

# Attempts in a row ended by infrastructure faults on one kept Ray cluster (controller.rayClusterPerRun)
# after which the next attempt gets a new one (``next_ray_cluster``).
KEPT_CLUSTER_INTERRUPTIONS = 2


def next_ray_cluster(obs: Observation, capacity: str) -> tuple[str | None, str | None]:
    """(the RayCluster the next attempt runs on, the run's old one to delete), with a cluster per run.

    The last attempt's cluster is kept while it exists, is the run's, its head was never lost, its
    shape is what the spec makes now for the attempt's ``capacity`` (an edited image, resources,
    replicas or secretEnv, or workers moving between spot and on-demand nodes, would otherwise be
    silently ignored, or leave the next driver waiting for workers the pods cannot hold), and it did
    not end the last ``KEPT_CLUSTER_INTERRUPTIONS`` attempts in a row by infrastructure faults;
    otherwise the next generation, and the old one deleted (a re-created head would start a
    new Ray cluster anyway, and its pods would hold capacity the new one waits for). A namesake's
    cluster (another TrainingRun of this name, being garbage-collected) is never deleted.
    """
    if not obs.ray_cluster_per_run:
        return None, None
    current = obs.state.current
    last = current.ray_cluster if current is not None else None
    if not last:
        return ray_cluster_name(obs.run.name, 1), None
    seen = obs.ray_cluster if obs.ray_cluster is not None and obs.ray_cluster.name == last else None
    ours = seen is not None and (obs.run_uid is None or seen.owner_uid == obs.run_uid)
    usable = seen is not None and ours and seen.head_lost is None and not _reshaped(obs, seen, capacity)
    if usable and not _interrupted_on(obs.state, last):
        return last, None
    following = ray_cluster_name(obs.run.name, ray_cluster_generation(last, obs.run.name) + 1)
    return following, (last if ours else None)


def _reshaped(obs: Observation, seen: RayClusterView, capacity: str) -> bool:
    """Whether the spec now makes a cluster of another shape than ``seen`` for ``capacity`` (one made
    before clusters carried their shape is taken as it is)."""
    shape = obs.ray_cluster_shapes.get(capacity)
    return seen.shape is not None and shape is not None and seen.shape != shape


def _interrupted_on(state: RunState, ray_cluster: str) -> bool:
    """Whether the last ``KEPT_CLUSTER_INTERRUPTIONS`` attempts all ran on ``ray_cluster`` and ended
    Interrupted (infrastructure faults, nothing spent): the cluster itself may be what fails them
    (its nodes drained, a broken head: "Job supervisor actor could not be scheduled"), and waiting
    on it would stall the run for ever. A new one costs what every attempt of a run without a kept
    cluster pays; an outage elsewhere (S3) merely gets a new cluster for its next attempt."""
    last = state.attempts[-KEPT_CLUSTER_INTERRUPTIONS:]
    return (
        len(last) == KEPT_CLUSTER_INTERRUPTIONS
        and interruptions_in_a_row(last) == KEPT_CLUSTER_INTERRUPTIONS
        and all(attempt.ray_cluster == ray_cluster for attempt in last)
    )


def why_not_kept(obs: Observation, old: str, capacity: str) -> str:
    seen = obs.ray_cluster
    if seen is None or seen.name != old:
        return "gone"
    if seen.head_lost:
        return f"its head was lost: {seen.head_lost}"
    if _reshaped(obs, seen, capacity):
        return (
            "the run's spec now makes another (its image, resources, replicas, secretEnv or placement changed, "
            "or its workers move between spot and on-demand nodes)"
        )
    if obs.run_uid is not None and seen.owner_uid != obs.run_uid:
        return "another TrainingRun's"
    return f"the last {KEPT_CLUSTER_INTERRUPTIONS} attempts on it ended by infrastructure faults"
