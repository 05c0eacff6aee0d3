"""JSON that a run's owner may have written, parsed within a memory bound.

The controller reads, for every run, objects that whoever can write to the run's bucket (or its
directory) can write: the current attempt's progress, an ended attempt's records, the newest
checkpoint's manifest. ``json.loads`` makes a Python object of every value, 30 to 90 bytes for a
value written in two to five characters: 64 MiB of ``[1,1,1],`` took nearly 2 GiB, enough for one run
to crash-loop a controller that serves the whole cluster. So each such object has two bounds,
checked before anything is parsed: its bytes (also checked as it is read, train/storage/store.py)
and its values (``json_values``). Each writer of ours stays under the bounds its readers keep
(tests/unit/test_read_memory.py measures the reads at the bounds, and checks the writers).

Only ASCII is read: our writers escape every other character (``json.dumps``' default), and one
character past ASCII would make Python hold the decoded text at four bytes a character.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A JSON string, escapes included, or an unterminated one to the end (json.loads refuses it there):
# each quote that opens a string is scanned once, and possessively, so any document is scanned in
# linear time (a pattern that could fail would rescan from every escaped quote, in quadratic time).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_VALUE_MARKS = (b"[", b"{", b",", b":")


def json_values(document: bytes) -> int:
    """How many values ``json.loads`` makes of ``document``, at most, counted without making any.

    Every value but the outermost follows a ``[``, ``{``, ``,`` or ``:`` outside strings (a key
    counts as a value: it is an object too); an empty container is counted twice.
    """
    structure = _STRING.sub(b"", document)
    return 1 + sum(structure.count(mark) for mark in _VALUE_MARKS)


def bounds_problem(document: bytes, *, max_bytes: int, max_values: int) -> str | None:
    """Why ``document`` is past its bounds (a phrase for a message), or None when it is within them."""
    if len(document) > max_bytes:
        return f"it has {len(document)} bytes, more than the {max_bytes} allowed"
    if not document.isascii():
        return "it has characters other than ASCII (spotray escapes them)"
    values = json_values(document)
    if values > max_values:
        return f"it has {values} JSON values, more than the {max_values} allowed"
    return None


def load_json(document: bytes, *, max_bytes: int, max_values: int) -> Any:
    """``json.loads`` of a document within its bounds; ValueError for one past them, as for one that is not
    JSON (the readers treat both as unreadable)."""
    problem = bounds_problem(document, max_bytes=max_bytes, max_values=max_values)
    if problem is not None:
        raise ValueError(f"not parsed: {problem}")
    try:
        return json.loads(document)
    except RecursionError:  # nested deeper than the interpreter recurses: not ours either
        raise ValueError("not parsed: it is nested too deep") from None
