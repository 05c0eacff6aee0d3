"""The peak memory of the controller's reads, each measured alone (tests/unit/test_read_memory.py).

    python -m tests.read_memory KIND=DIRECTORY ...

Reads each KIND (progress, records, manifest) of attempt 1 of run ``r`` from its DIRECTORY (a
``file://`` store) with the functions the controller calls, each in a child forked for that read
alone, and prints one JSON line per read: how far the peak resident memory rose above the resident
memory before it, in bytes (Linux: /proc/self/status, with the peak reset first).
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotray.contract.attempts import AttemptId
from spotray.controller.run_store import StoreReports, last_checkpoint_status
from spotray.train.records.attempt_records import read_attempt_records
from spotray.train.storage.store import ObjectStore, open_store

ATTEMPT = AttemptId("r", 1)
# What the controller reads of a run: its current attempt's report (progress, goodput, the newest
# checkpoint), an ended attempt's records, and the newest checkpoint's manifest alone.
READS: dict[str, Callable[[ObjectStore], Any]] = {
    "progress": lambda store: StoreReports().read(store, ATTEMPT, ended=True),
    "records": lambda store: read_attempt_records(store, ATTEMPT),
    "manifest": last_checkpoint_status,
}


def _memory_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match, f"no {field} in /proc/self/status"
    return int(match.group(1))


def _measure(kind: str, directory: str) -> int:
    store = open_store(f"file://{directory}")
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from what is resident now
    before = _memory_kib("VmRSS")
    READS[kind](store)
    return (_memory_kib("VmHWM") - before) * 1024


def main(arguments: list[str]) -> None:
    for argument in arguments:
        kind, _, directory = argument.partition("=")
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(reader)
            try:
                os.write(writer, str(_measure(kind, directory)).encode())
            except BaseException:  # the child must never return into the parent's loop
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        os.close(writer)
        with os.fdopen(reader) as result:
            risen = result.read()
        _, status = os.waitpid(child, 0)
        assert status == 0, f"the read of {kind} failed (wait status {status})"
        assert risen, f"the read of {kind} reported nothing"
        print(json.dumps({"kind": kind, "directory": directory, "peak_rise": int(risen)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
