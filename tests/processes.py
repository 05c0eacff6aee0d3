"""The processes a test started, read from /proc: what a test checks is gone, or aborts when hung."""

from __future__ import annotations

from pathlib import Path

from spotray.train.processes.subprocesses import parent_pid, start_time


def process_tree(root: int) -> dict[int, tuple[int, str]]:
    """Every descendant of ``root``: pid -> (start time, command line)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (parent := parent_pid(int(entry.name))) is not None:
            parents[int(entry.name)] = parent
    tree, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                started = start_time(pid)
                try:
                    command = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode()[:120]
                except OSError:
                    continue
                if started is not None:
                    tree[pid] = (started, command)
                    frontier.append(pid)
    return tree
