"""Output that fits a terminal (aligned tables, like kubectl) or a program (``-o json|yaml``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from spotray.contract.status import parse_date_time

FORMATS = ("table", "json", "yaml")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns three spaces apart, headers in capitals, as ``kubectl get`` prints them."""
    cells = [[str(h).upper() for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def render_data(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False).rstrip("\n")
    raise ValueError(f"not a data format: {fmt}")


def emit(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    """An age as kubectl shows one, in the largest unit that gives at least 2: 90s, 12m, 3h, 5d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_time(text: object) -> datetime | None:
    """A time as Kubernetes writes it, in any RFC 3339 form ("2025-01-02T03:04:05Z", fractional
    seconds, an offset: spotray/contract/status.py ``parse_date_time``); None if absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_date_time(text)
    except ValueError:
        return None


def age_since(text: str | None, now: datetime | None = None) -> str:
    when = parse_time(text)
    if when is None:
        return "-"
    return human_age(((now or datetime.now(UTC)) - when).total_seconds())
