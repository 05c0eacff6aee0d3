"""The controller's memory against hostile objects: every read, at its object's bounds, within one budget.

Whoever can write to a run's bucket (or its file:// directory) writes what the controller reads for
that run: the current attempt's progress, an ended attempt's records, the newest checkpoint's
manifest. Each is built here at its bounds (spotray/contract/bounded_json.py) in the shape that costs
Python the most memory per byte or per value, and read in a fresh process by the functions the
controller calls (tests/read_memory.py), which reports how far the read raised its peak memory.

The budget, ``READ_BUDGET``: 16 MiB for one read, the object and everything parsing it makes. The
chart limits the controller to 512 MiB (controller.resources.limits.memory); it holds about 90 MiB
once imported, more with many runs; and its 16 reconcile threads (controller/handlers.py
``WORKERS``) may each be reading some run's object at once: 16 x 16 MiB leaves room for the rest.
Before the bounds of issue 38 (64 MiB for progress, 16 MiB for a manifest, no value bound), five of
these shapes failed: a progress object of ``[1,1,1]`` points raised the peak by 1,991 MiB, one string
by 448 MiB; a manifest of empty lists by 418 MiB, one string by 112 MiB; a record by 26 MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotray.contract.attempts import MAX_RECORD_BYTES, MAX_RECORD_VALUES
from spotray.contract.bounded_json import json_values
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME, MAX_MANIFEST_BYTES, MAX_MANIFEST_VALUES, Manifest
from spotray.train.records.attempt_records import read_record
from spotray.train.records.progress_log import MAX_PROGRESS_BYTES, MAX_PROGRESS_VALUES, parse_attempt_progress
from spotray.train.storage.store import open_store
from tests.read_memory import ATTEMPT

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
READ_BUDGET = 16 << 20
PROGRESS, RECORDS, MANIFEST = "progress", "records", "manifest"
KEYS = {PROGRESS: ATTEMPT.progress_key, RECORDS: ATTEMPT.outcome_key, MANIFEST: f"checkpoint-1/{MANIFEST_NAME}"}
BOUNDS = {
    PROGRESS: (MAX_PROGRESS_BYTES, MAX_PROGRESS_VALUES),
    RECORDS: (MAX_RECORD_BYTES, MAX_RECORD_VALUES),
    MANIFEST: (MAX_MANIFEST_BYTES, MAX_MANIFEST_VALUES),
}
UNBOUNDED = sys.maxsize


@dataclass(frozen=True)
class Shape:
    """An object of ``kind``: ``head``, then ``unit`` (each ``%`` field: its number) as many times as the bounds
    allow with commas between, then ``tail``; with no unit, ``head``, ``a`` to the byte bound, ``tail``."""

    name: str
    kind: str
    head: bytes
    unit: bytes
    tail: bytes
    by_values: bool = True  # False: to the byte bound only, past the value bound (refused before parsing)

    def numbered(self, number: int) -> bytes:
        return self.unit % ((number,) * self.unit.count(b"%"))

    def document(self) -> bytes:
        max_bytes, max_values = BOUNDS[self.kind]
        room = max_bytes - len(self.head) - len(self.tail)
        if not self.unit:
            return self.head + b"a" * room + self.tail
        # Every unit is as long as the first, and costs its own values and the comma before it.
        count = (room + 1) // (len(self.numbered(0)) + 1)
        if self.by_values:
            count = min(count, (max_values - json_values(self.head + self.tail) + 1) // json_values(self.numbered(0)))
        return self.head + b",".join(self.numbered(number) for number in range(count)) + self.tail


PROGRESS_HEAD = b'{"run_id":"r","attempt":1,"points":['
RECORD_HEAD = b'{"run_id":"r","attempt":1,"x":['
MANIFEST_HEAD = b'{"format":1,"step":1,"world_size":1,"created_at":0,"files":{'
# An escape past Latin-1 at the end makes Python hold the whole string at four bytes a character.
STRING_TAIL = b'\\ud83d\\ude00"}'
SHAPES = [
    Shape("progress: [1,1,1] points to the byte bound", PROGRESS, PROGRESS_HEAD, b"[1,1,1]", b"]}", by_values=False),
    Shape("progress: points to the value bound", PROGRESS, PROGRESS_HEAD, b"[1%06d,0.5,1%09d.5]", b"]}"),
    Shape("progress: keys to the value bound", PROGRESS, b'{"run_id":"r","attempt":1,"x":{', b'"k%07d":0', b"}}"),
    Shape("progress: one string", PROGRESS, b'{"run_id":"r","attempt":1,"x":"', b"", STRING_TAIL),
    Shape("records: empty lists to the byte bound", RECORDS, RECORD_HEAD, b"[]", b"]}", by_values=False),
    Shape("records: empty lists to the value bound", RECORDS, RECORD_HEAD, b"[]", b"]}"),
    Shape("records: one string", RECORDS, b'{"run_id":"r","attempt":1,"x":"', b"", STRING_TAIL),
    Shape("manifest: empty lists to the byte bound", MANIFEST, b'{"format":1,"x":[', b"[]", b"]}", by_values=False),
    Shape("manifest: files to the bounds", MANIFEST, MANIFEST_HEAD, b'"f%08d":{"size":1,"sha256":""}', b"}}"),
    Shape("manifest: keys to the value bound", MANIFEST, b'{"format":1,"x":{', b'"k%07d":0', b"}}"),
    Shape("manifest: one string", MANIFEST, b'{"format":1,"x":"', b"", STRING_TAIL),
]


@pytest.fixture(scope="module")
def peak_rise(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Each shape's read: how far it raised the peak memory of the process reading it, in bytes."""
    root = tmp_path_factory.mktemp("hostile")
    arguments = []
    for number, shape in enumerate(SHAPES):
        path = root / str(number) / KEYS[shape.kind]
        path.parent.mkdir(parents=True)
        path.write_bytes(shape.document())
        arguments.append(f"{shape.kind}={root / str(number)}")
    measured = subprocess.run(
        [sys.executable, "-m", "tests.read_memory", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert measured.returncode == 0, measured.stderr[-3000:]
    lines = [json.loads(line) for line in measured.stdout.splitlines()]
    return {SHAPES[int(Path(line["directory"]).name)].name: line["peak_rise"] for line in lines}


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
def test_a_read_at_the_bounds_stays_within_the_budget(shape: Shape, peak_rise: dict[str, int]) -> None:
    risen = peak_rise[shape.name]
    assert risen <= READ_BUDGET, f"{shape.name}: the read raised the peak memory by {risen / 2**20:.0f} MiB"


def test_the_measurement_sees_a_parse(peak_rise: dict[str, int]) -> None:
    """Not a budget met by measuring nothing: the largest accepted progress object shows."""
    assert peak_rise["progress: points to the value bound"] > 2 << 20


def test_objects_at_the_value_bounds_are_read_not_refused(tmp_path: Path) -> None:
    """The budget holds for objects that are parsed, not only for objects refused before parsing."""
    by_name = {shape.name: shape.document() for shape in SHAPES}
    progress = parse_attempt_progress(by_name["progress: points to the value bound"], ATTEMPT, None)
    assert progress is not None
    assert len(progress.points) > MAX_PROGRESS_VALUES // 5
    (tmp_path / KEYS[RECORDS]).parent.mkdir(parents=True)
    (tmp_path / KEYS[RECORDS]).write_bytes(by_name["records: empty lists to the value bound"])
    assert read_record(open_store(f"file://{tmp_path}"), KEYS[RECORDS], ATTEMPT) is not None
    manifest = Manifest.from_json(by_name["manifest: files to the bounds"], "the test's manifest")
    assert len(manifest.files) > MAX_MANIFEST_VALUES // 7


@pytest.mark.parametrize("shape", [s for s in SHAPES if not s.by_values], ids=lambda s: s.name)
def test_an_object_past_its_value_bound_is_refused_unparsed(shape: Shape) -> None:
    _, max_values = BOUNDS[shape.kind]
    assert json_values(shape.document()) > max_values
