"""RUN, as the checkpoint commands take it: a manifest file, a checkpoint URI, or a TrainingRun's name.

    spotray checkpoints jobs/gpt2/trainingrun.yaml     # the manifest's spec.checkpoint.uri
    spotray checkpoints s3://my-bucket/runs/gpt2       # a checkpoint URI (or /path, file:///path)
    spotray checkpoints gpt2 -n team-a                 # a TrainingRun in the current kube context

Credentials for S3 come from the usual AWS_* variables (``StoreConfig.from_env``), never from the
cluster: the CLI reads the bucket directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from spotray.cli.cluster_options import KubeOptions
from spotray.cli.exit_codes import NotFoundError
from spotray.contract.errors import SpotrayError
from spotray.contract.names import DEFAULT_CHECKPOINT_KEY_SECRET
from spotray.contract.spec import load_training_run
from spotray.contract.uris import parse_uri
from spotray.train.storage.store import ObjectStore, RetryPolicy, StoreConfig, open_store

RUN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# A wrong endpoint should fail within seconds at a terminal, not after the trainer's ten minutes.
CLI_RETRY = RetryPolicy(deadline_s=20.0)
# A server that accepts and never answers, too: one try per request, each waiting at most 15 s for a
# byte (a transfer that flows is never cut), so a read ends within about 40 s, where botocore's
# own four tries of the trainer's 60 s read timeout made it 240 s (tests/integration/test_silent_s3.py).
CLI_READ_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RunLocation:
    """Where a run keeps its checkpoints, and how we found out (for messages)."""

    name: str
    uri: str
    source: str
    key_secret: str | None = None  # the Secret with the run's checkpoint key, when the run is known
    namespace: str | None = None  # the run's namespace, when it was read from the cluster


def locate_run(run: str, kube: KubeOptions) -> RunLocation:
    """Resolve RUN to its checkpoint URI; a name is looked up in the cluster only when it is nothing else."""
    path = Path(run)
    if path.is_file():
        training_run = load_training_run(path)
        return RunLocation(
            training_run.name, training_run.spec.checkpoint.uri, f"manifest {path}", training_run.checkpoint_key_secret
        )
    if path.is_dir():
        return RunLocation(path.resolve().name, str(parse_uri(str(path.resolve()))), f"directory {path}")
    if path.suffix in (".yaml", ".yml", ".json") and "://" not in run:
        raise NotFoundError(f"manifest {path} does not exist", "give the path of a TrainingRun manifest")
    if "://" in run or run.startswith("/"):
        parsed = parse_uri(run)
        return RunLocation(parsed.prefix.rsplit("/", 1)[-1] or parsed.bucket, str(parsed), "URI")
    if not RUN_NAME.match(run):
        raise SpotrayError(
            f"RUN {run!r} is not a manifest file, a checkpoint URI or a TrainingRun name",
            "give a TrainingRun YAML file, s3://BUCKET/PREFIX, an absolute directory, or a TrainingRun's name",
        )
    from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415 - the kubernetes client loads only when a cluster is asked

    cluster = ClusterConnection(kube)
    document = cluster.get_run(run)
    uri = str(document.get("spec", {}).get("checkpoint", {}).get("uri", ""))
    if not uri:
        raise SpotrayError(f"TrainingRun {cluster.namespace}/{run} has no spec.checkpoint.uri", "add one and submit")
    named = document.get("spec", {}).get("checkpoint", {}).get("keySecret")
    key_secret = str(named) if named else DEFAULT_CHECKPOINT_KEY_SECRET
    where = f"TrainingRun {cluster.namespace}/{run} (context {cluster.context_name})"
    return RunLocation(run, uri, where, key_secret, cluster.namespace)


def open_run_store(location: RunLocation) -> ObjectStore:
    """The run's checkpoint store, with S3 endpoint and credentials from the AWS_* environment."""
    reach = replace(StoreConfig.from_env(), read_timeout_s=CLI_READ_TIMEOUT_S, request_attempts=1)
    return open_store(location.uri, reach, CLI_RETRY)
