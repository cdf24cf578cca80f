"""Formatting and parsing of durations (nanoseconds) for the viewer, the summary and filters."""

from __future__ import annotations

import re

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "min": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|min|m|h)?\s*$")


def format_ns(ns: float, digits: int = 3) -> str:
    """A duration in the largest unit that keeps it >= 1: '12.5ms', '3.20s', '850ns'."""
    value = abs(ns)
    for unit, scale in (("h", 3.6e12), ("min", 6e10), ("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if value >= scale:
            return f"{'-' if ns < 0 else ''}{_significant(value / scale, digits)}{unit}"
    return f"{int(ns)}ns"


def _significant(x: float, digits: int) -> str:
    decimals = max(0, digits - len(str(int(x))))
    return f"{x:.{decimals}f}"


def parse_duration_ns(text: str) -> int:
    """'10ms' -> 10_000_000; a bare number is seconds. ValueError names the accepted forms."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration; write e.g. 250us, 10ms, 1.5s or 2m")
    return int(float(match.group(1)) * _UNITS_NS[match.group(2) or "s"])
