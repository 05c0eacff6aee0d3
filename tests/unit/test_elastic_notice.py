"""An elastic group goes on without the ranks a spot notice takes (train/hf/notice.py, drain_handshake.py)."""

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from spotray.train.hf.notice import PreemptionNoticeCallback, goes_on_without, notice_ranks
from spotray.train.launch.drain import raylet_pids
from spotray.train.processes.drain_handshake import checkpointed, checkpointed_marker, mark_checkpointed
from spotray.train.records.event_log import EventLog, read_events

pytestmark = pytest.mark.unit
NODE = "a3f0" * 14  # a Ray node id is 56 hex digits


@dataclass
class RayNotice:
    """Ray's PreemptionInfo as far as the callback reads it."""

    preempted_ranks: list[int]
    deadline_ms: int | None = None


@dataclass
class FakeSync:
    flushes: int = 0
    store: object = field(default=None)
    leaving: bool = False  # a notice that stops the group: its last saves take no other run's URI
    held_in_copies: bool = False  # whether the nodes that stay hold the save in their copies
    asked_copies: list[tuple[int, frozenset[int]]] = field(default_factory=list)

    def flush(self) -> None:
        self.flushes += 1

    def copies_hold(self, step: int, going: frozenset[int], timeout_s: float) -> bool:
        self.asked_copies.append((step, going))
        return self.held_in_copies

    def leave(self) -> None:
        self.leaving = True


@pytest.mark.parametrize(
    ("ranks", "size", "min_workers", "room", "goes_on"),
    [
        ({1}, 2, 1, 0, True),  # an elastic run of 2 keeps its 1 minimum
        ({2, 3}, 4, 2, 0, True),
        ({1, 2, 3}, 4, 2, 0, False),  # too few left: the whole group stops on its checkpoint
        ({1, 2, 3}, 4, 2, 1, True),  # ... unless a spare makes up the minimum
        ({0, 1}, 2, 1, 0, False),  # every rank (the driver's SIGTERM drains every node)
        ({1}, 2, None, 0, False),  # a fixed-size run with no room elsewhere
        ({1}, 2, None, 1, True),  # a fixed-size run with a spare free: it restarts at full size there
        ({1, 2}, 4, None, 1, False),  # two ranks taken, room for one: a fixed size cannot go on
        ({1, 2}, 4, None, 3, True),
        (set(), 2, None, 4, False),  # a SIGTERM notice names no rank: every rank goes, room or not
        (set(), 2, 1, 0, False),
        ({0}, 2, 1, 0, True),  # rank 0's node: Ray Train gives the smaller group a new rank 0
    ],
)
def test_a_group_goes_on_only_when_enough_ranks_are_left_or_have_room_elsewhere(
    ranks: set[int], size: int, min_workers: int | None, room: int, goes_on: bool
) -> None:
    assert goes_on_without(frozenset(ranks), size, min_workers, room) is goes_on


def test_a_notice_names_its_ranks_only_when_ray_gives_them() -> None:
    assert notice_ranks(RayNotice([3, 1])) == {1, 3}
    assert notice_ranks("sigterm") == frozenset()


def hf_state(step: int) -> TrainerState:
    state = TrainerState()
    state.global_step, state.max_steps = step, 100
    return state


@pytest.mark.parametrize("held_in_copies", [False, True])
def test_an_elastic_notice_saves_then_trains_on_and_lets_the_node_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_in_copies: bool
) -> None:
    """Once the checkpoint is safe: in the store, or (the group restarts on the nodes that stay, whose
    copies outlive it) in their copies, without waiting for the store."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr("spotray.train.hf.notice.world_size", lambda: 2)
    monkeypatch.setattr("spotray.train.hf.notice.world_rank", lambda: 1)  # this rank is on the leaving node
    notices: list[RayNotice | None] = [None, RayNotice([1]), RayNotice([1]), RayNotice([0, 1])]
    events = EventLog(tmp_path / "events.jsonl")
    sync = FakeSync(held_in_copies=held_in_copies)
    callback = PreemptionNoticeCallback(
        sync,  # type: ignore[arg-type]
        events,
        attempt=1,
        target_interval_s=0.0,
        calibration_steps=1,
        notice=lambda: notices.pop(0),
        min_workers=1,
        node_id=lambda: NODE,
    )
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])

    control = TrainerControl()
    callback.on_step_end(args, hf_state(1), control)  # no notice yet
    assert not control.should_save
    callback.on_step_end(args, hf_state(2), control)
    assert control.should_save, "an emergency checkpoint at once"
    assert not control.should_training_stop, "the ranks left go on"
    assert not sync.leaving, "a group that goes on still owns its URI"
    assert not checkpointed(NODE), "the node may not go before the checkpoint is safe"
    callback.on_save(args, hf_state(2), control)
    assert sync.asked_copies == [(2, frozenset({1}))]
    assert sync.flushes == (0 if held_in_copies else 1), "the store waited for only when the copies do not hold it"
    assert checkpointed(NODE), "the rank on the leaving node tells its preStop hook"
    [emergency] = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "emergency_checkpoint"]
    assert emergency["safe_in"] == ("node copies" if held_in_copies else "store")
    flushes = sync.flushes

    control = TrainerControl()
    callback.on_step_end(args, hf_state(3), control)  # Ray repeats the same notice until the node is gone
    assert not control.should_save
    callback.on_save(args, hf_state(3), control)  # an ordinary save later: nothing of the notice's
    assert sync.flushes == flushes

    control = TrainerControl()
    callback.on_step_end(args, hf_state(4), control)  # now every node: the whole group stops
    assert control.should_save
    assert control.should_training_stop
    assert sync.leaving


@pytest.mark.parametrize(("room", "goes_on"), [(1, True), (0, False)])
def test_a_fixed_size_group_with_spares_goes_on_only_when_rank_0_reads_room_for_the_ranks_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int, goes_on: bool
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr("spotray.train.hf.notice.world_size", lambda: 2)
    monkeypatch.setattr("spotray.train.hf.notice.world_rank", lambda: 0)
    readings: list[int] = []

    def spare_room() -> int:
        readings.append(room)
        return room

    events = EventLog(tmp_path / "events.jsonl")
    callback = PreemptionNoticeCallback(
        FakeSync(),  # type: ignore[arg-type]
        events,
        attempt=1,
        target_interval_s=0.0,
        calibration_steps=1,
        notice=lambda: RayNotice([1]),
        spare_room=spare_room,
        node_id=lambda: NODE,
    )
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    control = TrainerControl()
    callback.on_step_end(args, hf_state(1), control)
    assert control.should_save, "an emergency checkpoint either way"
    assert control.should_training_stop is not goes_on
    assert readings == [room], "the room is read once, at the notice"
    notice = next(event for event in read_events(tmp_path / "events.jsonl") if event["event"] == "preemption_notice")
    assert (notice["going_on"], notice["spare_room"]) == (goes_on, room)


def test_the_handshake_file_is_per_node_and_refuses_what_is_not_a_node_id(tmp_path: Path) -> None:
    mark_checkpointed(NODE, tmp_path)
    assert checkpointed(NODE, tmp_path)
    assert not checkpointed("b" * 56, tmp_path)
    with pytest.raises(ValueError, match="not a Ray node id"):
        checkpointed_marker("../../etc/passwd", tmp_path)


def test_the_hook_finds_its_nodes_raylet_by_the_node_id_on_its_command_line(tmp_path: Path) -> None:
    def process(pid: int, *args: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in args) + b"\0")

    process(10, "/venv/lib/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/x", f"--node_id={NODE}")
    process(11, "/venv/lib/ray/core/src/ray/raylet/raylet", f"--node_id={'b' * 56}")  # another node's
    process(12, "/venv/bin/python", "worker.py", f"--node_id={NODE}")  # a worker of the node: not the raylet
    (tmp_path / "self").mkdir()
    assert raylet_pids(NODE, tmp_path) == [10]


def test_the_prestop_hook_imports_ray_alone_so_it_starts_within_the_notice() -> None:
    """The hook is a new process in a grace period of 30 s (GKE): importing the launcher took it 14 s."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, spotray.train.launch.drain; print(','.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = result.stdout.strip().split(",")
    assert "ray" in loaded
    heavy = ("torch", "ray.train", "pandas", "transformers", "spotray.train.launch.launcher")
    assert [module for module in heavy if module in loaded] == []
