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
from collections.abc import Callable
from typing import Any, TypeVar

# A JSON string, escapes included, or an unterminated one to the end (json.loads refuses it there):
# each quote that opens a string is scanned once, and possessively, so any document is scanned in
# linear time (a pattern that could fail would rescan from every escaped quote, in quadratic time).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_VALUE_MARKS = (b"[", b"{", b",", b":")
T = TypeVar("T")


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


# ------------------------------------------------------------------------------------------ ranges
# A parsed object within its bounds can still hold values no writer of ours makes, each of which
# would fail a reader later: ``datetime.fromtimestamp(1e300)`` raises OverflowError, a step past
# int64 is refused by the API server in a status patch, and NaN is not JSON at all. So each reader
# checks every number it takes in range as well (tests/unit/test_hostile_values.py, one per field).

# Unix seconds up to the end of year 9999: what ``datetime`` (and RFC 3339) can show.
MAX_UNIX_TIME = 253_402_300_799.0
# A step, a count of steps or workers: what a status field of format int64 holds.
MAX_COUNT = 2**63 - 1


def unix_time(value: object, what: str) -> float:
    """``value`` as seconds since 1970, finite and no later than year 9999; ValueError otherwise."""
    return _between(value, what, 0.0, MAX_UNIX_TIME, "a time between 1970 and 9999")


def seconds(value: object, what: str) -> float:
    """``value`` as a duration in seconds: finite, not negative (and no longer than a time can be)."""
    return _between(value, what, 0.0, MAX_UNIX_TIME, "a duration of 0 s or more")


def count(value: object, what: str, *, minimum: int = 0) -> int:
    """``value`` as a whole number from ``minimum`` to int64's largest; ValueError for a float, bool or string."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not a whole number: {value!r}"[:200])
    if not minimum <= value <= MAX_COUNT:
        raise ValueError(f"{what} is out of range ({minimum} to 2**63 - 1): {value}")
    return value


def number(value: object, what: str) -> float:
    """``value`` as a float; NaN and infinities pass (a diverged loss is a fact), a bool or a string does not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} is not a number: {value!r}"[:200])
    return float(value)


def optional(read: Callable[[object, str], T], value: object, what: str) -> T | None:
    """``read(value, what)``, or None for None."""
    return None if value is None else read(value, what)


def _between(value: object, what: str, low: float, high: float, wanted: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} is not a number: {value!r}"[:200])
    if not low <= value <= high:  # NaN fails both comparisons
        raise ValueError(f"{what} is not {wanted}: {value!r}")
    return float(value)
