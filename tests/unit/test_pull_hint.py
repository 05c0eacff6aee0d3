"""`spotray pull` of a signed checkpoint without the key says how to get it: with the run's namespace, where
its key's Secret is (found running the README's cluster path: the hint's kubectl asked the default namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotray.cli.checkpoint_commands import signature_line
from spotray.cli.target import RunLocation
from spotray.train.checkpoints.checkpoint import CheckpointInfo, Manifest
from spotray.train.storage.store import open_store

pytestmark = pytest.mark.unit


def test_the_key_hint_names_the_runs_namespace_when_the_run_came_from_the_cluster(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    manifest = Manifest(40, 1, {}, 0.0, signed=True)
    info = CheckpointInfo(40, "checkpoint-40", 0, manifest, None)
    from_cluster = RunLocation(
        "gpt2-demo", str(store.uri), "TrainingRun team/gpt2-demo", "spotray-checkpoint-key", "team"
    )
    assert "kubectl get secret spotray-checkpoint-key -n team -o jsonpath" in signature_line(store, info, from_cluster)
    from_uri = RunLocation("gpt2-demo", str(store.uri), "URI")
    assert "kubectl get secret spotray-checkpoint-key -o jsonpath" in signature_line(store, info, from_uri)
