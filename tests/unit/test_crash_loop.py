"""train/launch/crash_loop.py: when a training loop that keeps raising ends its attempt (the rule, without Ray)."""

import pytest

from spotray.train.launch.crash_loop import Crash, CrashLedger, crash_loop_verdict, error_tail

pytestmark = pytest.mark.unit


def test_the_crash_loop_verdict_needs_bound_crashes_with_no_progress_between() -> None:
    assert crash_loop_verdict([Crash(0, 20, "e1"), Crash(0, 20, "e2")]) is None
    looping = crash_loop_verdict([Crash(0, 20, "e1"), Crash(1, 20, "e2"), Crash(0, 20, "ValueError: bug")])
    assert looping is not None
    assert (looping.crashes, looping.checkpoint_step) == (3, 20)
    assert "ValueError: bug" in looping.message
    assert "no new checkpoint since checkpoint-20" in looping.message
    # A new checkpoint between crashes is progress: the count starts again.
    assert crash_loop_verdict([Crash(0, 20, "e"), Crash(0, 20, "e"), Crash(0, 40, "e")]) is None
    # A store that cannot be listed (a deleted bucket) still counts: unknown is the same each time.
    assert crash_loop_verdict([Crash(0, None, "NoSuchBucket")] * 3) is not None


def test_the_ledger_counts_one_crash_per_worker_group_and_tells_the_next_group() -> None:
    ledger = CrashLedger()
    for _ in range(3):
        group, verdict = ledger.new_group()
        assert verdict is None
        ledger.report(group, Crash(0, None, "boom"))
        ledger.report(group, Crash(1, None, "boom on rank 1 too"))  # the same group: not counted again
    assert len(ledger.crashes) == 3
    _, verdict = ledger.new_group()
    assert verdict is not None
    assert verdict == ledger.verdict()


def test_error_tail_keeps_the_end_of_a_long_traceback() -> None:
    try:
        raise RuntimeError("x" * 10_000 + " the cause")
    except RuntimeError as error:
        tail = error_tail(error, max_chars=500)
    assert len(tail) == 500
    assert tail.endswith("the cause")
    assert tail.startswith("...")
