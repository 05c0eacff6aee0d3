"""Nothing left behind: a watchdog that ends local mode's processes when local mode ends, however it ends.

``spotray run --local`` starts a Ray cluster (``ray start --head`` and its daemons: gcs_server,
raylet, the workers), an S3 server and each attempt's job driver, every one in a session of its own
so that an injected fault can kill it as a unit. A child dies with its parent only if it asked to
(PR_SET_PDEATHSIG), and Ray's daemons do not: a command line killed by SIGKILL, or by a signal it
did not handle, used to leave a whole Ray cluster running.

The watchdog is a small child process (``python -m spotray.local.reaper``) in a session of its own that
ignores the signals a terminal sends. Local mode writes to its stdin each session it starts (the
S3 server's, the Ray cluster's, each driver's). When that pipe closes (local mode finished, or its
process died in any way, SIGKILL included, since the kernel closes a dead process's pipes) it
SIGKILLs whatever of them is still alive and exits. On a normal exit local mode has stopped
everything itself, so there is nothing left to kill.

Local mode also sends the dataset cache directories its jobs announce (the ``start`` event's
``dataset_cache``): once every process is gone, the watchdog releases the streaming shared memory
registered for them (train/hf/streaming_memory.py), which a Ray worker killed at the end of a
run, or with the run, never releases itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from spotray.train.hf.streaming_memory import release_streaming_memory
from spotray.train.processes.subprocesses import session_members, start_time


class Reaper:
    """Local mode's handle on the watchdog: ``with Reaper() as reaper: reaper.watch_session(pid)``."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Reaper:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "spotray.local.reaper"], stdin=subprocess.PIPE, text=True, start_new_session=True
        )
        return self

    def watch_session(self, session_id: int) -> None:
        """Kill every process of this session (its leader's pid) if local mode ends without doing it."""
        self._send(f"session {session_id} {start_time(session_id) or 0}")

    def release_dataset_cache(self, cache_dir: str) -> None:
        """Release streaming's shared memory for this cache directory once local mode's processes are gone."""
        if "\n" not in cache_dir:
            self._send(f"cache {cache_dir}")

    def _send(self, line: str) -> None:
        assert self._process is not None
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # the watchdog died: nothing can be done here
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=30)


def reap(sessions: dict[int, int]) -> list[int]:
    """SIGKILL the members of each session whose leader is still the process registered (or gone).

    ``sessions`` maps a session id to its leader's start time: a leader pid reused by an unrelated
    process, with the same pid but another start time, is left alone. Returns the pids killed.
    """
    killed = []
    for session_id, leader_started in sessions.items():
        now_started = start_time(session_id)
        if now_started is not None and now_started != leader_started:
            continue
        for pid in session_members(session_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def main() -> int:
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    sessions: dict[int, int] = {}
    caches: set[str] = set()
    for line in sys.stdin:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "session":
            session_id, started = rest.split()
            sessions[int(session_id)] = int(started)
        elif kind == "cache":
            caches.add(rest)
    killed = reap(sessions)
    if killed:
        print(f"spotray: stopped {len(killed)} process(es) local mode left behind", file=sys.stderr)
    for cache in sorted(caches):
        release_streaming_memory(Path(cache))  # unlinking what a dying process still maps is safe
    return 0


if __name__ == "__main__":
    sys.exit(main())
