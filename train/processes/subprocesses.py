"""Helpers for the child processes spotray starts (the upload process, the local S3 server)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGTERM when its parent dies, so none is left behind (Linux).

    It makes one prctl call and takes no locks, which is what makes it safe between fork and exec.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, all its threads; None if it is gone."""
    fields = _stat_fields(pid)  # utime and stime are the 12th and 13th after the command name
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def session_members(session_id: int) -> list[int]:
    """Running PIDs whose session id is ``session_id`` (read from /proc, so nothing outside the session
    is touched; zombies, dead already, are left out)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))  # state, ppid, pgrp, session, ...
            if fields is not None and int(fields[3]) == session_id and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def is_running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie, dead but not yet reaped, is not running)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``; None if it is gone."""
    fields = _stat_fields(pid)  # state, ppid, ...
    return int(fields[1]) if fields is not None else None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one process, never a reused pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # field 22 of stat; the first two are cut


def start_in_own_session(command: list[str], env: dict[str, str], output_path: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (a Ctrl-C aimed at the caller does not reach it, and
    ``signal_session`` reaches every process it starts), output appended to ``output_path``; it dies
    with this process."""
    with output_path.open("ab") as output:
        return subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - one prctl call, see its docstring
        )


def signal_session(session_id: int, signum: int) -> None:
    """``signum`` to every process of the session, those that exit meanwhile skipped."""
    for pid in session_members(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
