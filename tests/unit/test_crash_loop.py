"""train/launch/crash_loop.py: when a training loop that keeps crashing ends its attempt (the rule, without Ray)."""

import pytest

from spotray.contract.errors import Cause
from spotray.train.launch.crash_loop import Crash, CrashLedger, crash_loop_verdict, error_tail

pytestmark = pytest.mark.unit

HEAD, SPOT_A, SPOT_B = "head-node", "spot-node-a", "spot-node-b"


def test_the_crash_loop_verdict_needs_bound_crashes_with_no_progress_between() -> None:
    assert crash_loop_verdict([Crash(0, 20, "e1"), Crash(0, 20, "e2")]) is None
    looping = crash_loop_verdict([Crash(0, 20, "e1"), Crash(1, 20, "e2"), Crash(0, 20, "ValueError: bug")])
    assert looping is not None
    assert (looping.crashes, looping.checkpoint_step) == (3, 20)
    assert "ValueError: bug" in looping.message
    assert "crashed 3 times with no new checkpoint since checkpoint-20" in looping.message
    # A new checkpoint between crashes is progress: the count starts again.
    assert crash_loop_verdict([Crash(0, 20, "e"), Crash(0, 20, "e"), Crash(0, 40, "e")]) is None
    # A store that cannot be listed (a deleted bucket) still counts: unknown is the same each time.
    assert crash_loop_verdict([Crash(0, None, "NoSuchBucket")] * 3) is not None


def test_the_ledger_counts_one_crash_per_worker_group_and_tells_the_next_group() -> None:
    ledger = CrashLedger()
    for _ in range(3):
        group, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=None)
        assert verdict is None
        ledger.report(group, Crash(0, None, "boom"))
        ledger.report(group, Crash(1, None, "boom on rank 1 too"))  # the same group: not counted again
    assert len(ledger.crashes) == 3
    _, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=None)
    assert verdict is not None
    assert verdict == ledger.verdict()


def test_workers_that_die_without_an_exception_reach_the_bound() -> None:
    """SIGKILL, the OOM killer, a segfault: the group reports nothing, and the next group's start counts it."""
    ledger = CrashLedger()
    for _ in range(3):
        _, verdict = ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=20)
        assert verdict is None
    _, verdict = ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=20)
    assert verdict is not None
    assert (verdict.crashes, verdict.checkpoint_step, verdict.cause) == (3, 20, Cause.TRAINING)
    assert "a worker of group 3 died without raising an exception" in verdict.message
    assert [crash.rank for crash in ledger.crashes] == [None, None, None]


def test_a_group_lost_with_a_node_does_not_count() -> None:
    """A spot reclaim or a removed Ray node is infrastructure: retried without limit, as before."""
    ledger = CrashLedger()
    nodes = [{HEAD, SPOT_A}, {HEAD, SPOT_B}, {HEAD, SPOT_A + "-again"}, {HEAD, SPOT_B + "-again"}, {HEAD}]
    for alive in nodes:
        _, verdict = ledger.new_group(workers=2, alive_nodes=alive, checkpoint_step=20)
        assert verdict is None
    assert ledger.crashes == []


def test_a_node_that_joined_excuses_nothing() -> None:
    """Only a node that was there at the group's start and is gone at the next one explains a silent end."""
    ledger = CrashLedger()
    for alive in [{HEAD}, {HEAD, SPOT_A}, {HEAD, SPOT_A, SPOT_B}]:
        ledger.new_group(workers=1, alive_nodes=alive, checkpoint_step=20)
    _, verdict = ledger.new_group(workers=1, alive_nodes={HEAD, SPOT_A, SPOT_B}, checkpoint_step=20)
    assert verdict is not None


def test_a_new_checkpoint_between_silent_deaths_starts_the_count_again() -> None:
    ledger = CrashLedger()
    for step in (20, 20, 40):
        _, verdict = ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=step)
        assert verdict is None
    _, verdict = ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=40)
    assert verdict is None
    assert [crash.checkpoint_step for crash in ledger.crashes] == [20, 40, 40]


def test_exceptions_and_silent_deaths_count_together() -> None:
    ledger = CrashLedger()
    group, _ = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
    ledger.report(group, Crash(1, 20, "ValueError: bug"))
    ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)  # then dies without a word
    group, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
    assert verdict is None
    ledger.report(group, Crash(0, 20, "MemoryError"))
    _, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
    assert verdict is not None
    assert verdict.crashes == 3
    assert verdict.last_error == "MemoryError"


def test_a_group_that_returned_or_was_resized_did_not_die() -> None:
    """A group stopped on a preemption notice returns, and Ray Train then starts another; an elastic
    group that grows (or shrinks) is stopped by Ray Train and started again at its new size."""
    ledger = CrashLedger()
    for _ in range(3):
        group, _ = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
        ledger.finished(group)
    for workers in (3, 2, 3):
        _, verdict = ledger.new_group(workers=workers, alive_nodes={HEAD}, checkpoint_step=20)
        assert verdict is None
    assert ledger.crashes == []


def test_a_report_after_the_next_group_started_is_not_counted_again() -> None:
    ledger = CrashLedger()
    first, _ = ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=None)
    ledger.new_group(workers=1, alive_nodes={HEAD}, checkpoint_step=None)  # counts group 1's silent end
    ledger.report(first, Crash(0, None, "late"))
    assert len(ledger.crashes) == 1


def test_error_tail_keeps_the_end_of_a_long_traceback() -> None:
    try:
        raise RuntimeError("x" * 10_000 + " the cause")
    except RuntimeError as error:
        tail = error_tail(error, max_chars=500)
    assert len(tail) == 500
    assert tail.endswith("the cause")
    assert tail.startswith("...")


def test_bad_input_ends_the_attempt_at_its_first_crash() -> None:
    """A checkpoint no model loads, a refused credential, a deleted bucket: a retry meets the same
    input, so the first such crash decides (it took three worker groups, 316 s in local mode)."""
    refused = Crash(0, 20, "UnloadableCheckpointError: no checkpoint loads", Cause.BAD_INPUT)
    verdict = crash_loop_verdict([refused])
    assert verdict is not None
    assert (verdict.crashes, verdict.cause) == (1, Cause.BAD_INPUT)
    assert "no checkpoint loads" in verdict.message
    assert "refused its input" in verdict.message
    assert "crashed 1 times" not in verdict.message
    assert crash_loop_verdict([Crash(0, 20, "ValueError: bug"), refused]) == verdict
    # The training code's own crash, or an infrastructure fault, still gets its three tries.
    assert crash_loop_verdict([Crash(0, 20, "ValueError: bug")]) is None
    assert crash_loop_verdict([Crash(0, 20, "store down", Cause.INFRASTRUCTURE)]) is None


def test_the_group_after_a_bad_input_crash_does_not_train() -> None:
    ledger = CrashLedger()
    group, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
    assert verdict is None
    ledger.report(group, Crash(1, 20, "BucketMissingError", Cause.BAD_INPUT))
    _, verdict = ledger.new_group(workers=2, alive_nodes={HEAD}, checkpoint_step=20)
    assert verdict is not None
    assert verdict.cause is Cause.BAD_INPUT
