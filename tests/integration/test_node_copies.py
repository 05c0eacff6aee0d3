"""The ring of node copies (train/checkpoints/node_copies.py) between three real gloo processes:
every node ends holding its own files and its previous neighbour's, byte for byte, each share with
its record (the SHA-256 of what was sent); a save a node skipped costs nothing; a byte changed on the
way is kept as it arrived and refused where the copy is used (the receiver does not hash: its use does);
a neighbour lost stops the copying with a warning, not the process."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import run_ranks
from tests.integration.node_copies_script import payload

pytestmark = [pytest.mark.integration, pytest.mark.core]


def own_files(node: int) -> dict[str, int]:
    return {
        f"rng_state_{node}.pth": 2_500_000 if node == 0 else 1000,
        f"empty_{node}": 0,
        f"sub/shard_{node}.bin": 70_000,
    }


def digests(node: int, step: int) -> dict[str, str]:
    return {name: hashlib.sha256(payload(node, step, size)).hexdigest() for name, size in own_files(node).items()}


def test_each_node_keeps_its_files_and_the_previous_nodes_and_a_lost_neighbour_only_stops_the_copying(
    tmp_path: Path,
) -> None:
    run_ranks(Path(__file__).with_name("node_copies_script.py"), [str(tmp_path)], {}, timeout_s=180, processes=3)
    reports = {node: json.loads((tmp_path / f"node-{node}.json").read_text()) for node in range(3)}
    for node in range(3):
        previous = (node - 1) % 3
        held = reports[node]["held_after_20"]
        assert held["10"] == own_files(node) | own_files(previous), node
        # At 20 node 1 skipped its save; node 2's bytes arrived at node 0 with one flipped, kept as they came.
        received_20 = previous != 1
        expected_20 = (own_files(node) if node != 1 else {}) | (own_files(previous) if received_20 else {})
        assert held["20"] == expected_20, node
        records = reports[node]["records_after_20"]
        assert records["10"] == {str(n): digests(n, 10) for n in (node, previous)}, node
        expected_records = {str(n): digests(n, 20) for n in (node, previous) if n != 1}
        assert records.get("20", {}) == expected_records, node
        copies = tmp_path / f"node-{node}" / "copies"
        changed = []
        for name, size in held["20"].items():
            owner = int(name.split("_")[-1].split(".")[0])
            if (copies / "checkpoint-20" / name).read_bytes() != payload(owner, 20, size):
                changed.append((owner, name))
        # One chunk carried node 2's files; its first byte flipped, in its first non-empty file.
        assert len(changed) == (1 if node == 0 else 0), (node, changed)
        assert all(owner == 2 for owner, _ in changed), (node, changed)
    # The changed copy keeps node 2's record (the sender's hashes), so its use refuses it: a completion
    # uploads nothing (a resume's exchange hashes against the manifest alike: tests/integration/test_read_once.py).
    assert "on node 0 does not match its record" in reports[0]["completion_at_20"], reports[0]["completion_at_20"]
    assert not any((tmp_path / "store").rglob("*_2*")), "a file of the refused share was uploaded"
    assert reports[0]["failed_at_20"] == reports[1]["failed_at_20"] == reports[2]["failed_at_20"] == "None"
    # Step 30: node 2 left. The others say so and go on; what they hold is only what arrived whole.
    assert reports[2]["failed"] == "None"
    for node in (0, 1):
        assert reports[node]["failed"] != "None", reports[node]
        assert own_files(node).items() <= reports[node]["held"]["30"].items()
        # keep=2: the newest two (30, 20) and the newest two whose round ended whole (20, 10). 30's round
        # never did, so 10 stays: a resume that cannot use 30 or 20 from the store still finds 10 here.
        assert set(reports[node]["held"]) == {"10", "20", "30"}, reports[node]["held"]
        assert not any(".incoming" in name for name in reports[node]["held"]["30"])
