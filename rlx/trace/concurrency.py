"""How many requests are running or queued at a moment (the viewer's time cursor).

Running = ``generate`` spans open at t. Queued = ``queued`` spans open at t, plus requests whose
``queued`` instant event is at or before t and whose first ``generate`` span (same process and
request id) has not started yet; a server may record queueing either way. Each count is two
vectorised comparisons over the intervals.
"""

from __future__ import annotations

import numpy as np

from rlx.trace.model import Trace

_MAX_TABLE = 1 << 25
"""Above this many (process, request id) pairs, first generations are found by sorting."""


class OpenCount:
    """Intervals, unsorted: a count scans them (under a millisecond for half a million), which costs
    less than sorting them when the viewer opens, for the few counts a cursor asks."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts, self.ends = starts, ends

    def at(self, t: float) -> int:
        """Intervals started at or before t and not yet ended."""
        return int(np.count_nonzero(self.starts <= t) - np.count_nonzero(self.ends <= t))


def running(trace: Trace) -> OpenCount:
    mine = _named(trace.spans.name, trace, "generate")
    return OpenCount(trace.spans.start[mine], trace.spans.end[mine])


def queued(trace: Trace) -> OpenCount:
    spans, events = trace.spans, trace.events
    mine = _named(spans.name, trace, "queued")
    marks = np.flatnonzero(_named(events.name, trace, "queued") & (events.request >= 0))
    proc_end = np.array([p.end_ns for p in trace.processes], np.int64)
    ends = _first_generate(trace, events.proc[marks], events.request[marks], proc_end[events.proc[marks]])
    ends = np.maximum(ends, events.time[marks])
    return OpenCount(np.r_[spans.start[mine], events.time[marks]], np.r_[spans.end[mine], ends])


def _first_generate(trace: Trace, procs: np.ndarray, requests: np.ndarray, default: np.ndarray) -> np.ndarray:
    """Start of the first generate span of each (process, request), else ``default``."""
    spans, width = trace.spans, max(len(trace.request_ids), 1)
    if not len(procs):
        return default
    gen = np.flatnonzero(_named(spans.name, trace, "generate") & (spans.request >= 0))
    keys = spans.proc[gen].astype(np.int64) * width + spans.request[gen]
    wanted = procs.astype(np.int64) * width + requests
    if len(trace.processes) * width <= _MAX_TABLE:  # one slot per (process, request): no sort
        none = np.iinfo(np.int64).max
        first_start = np.full(len(trace.processes) * width, none, np.int64)
        np.minimum.at(first_start, keys, spans.start[gen])
        found = first_start[wanted]
        return np.where(found != none, found, default)
    order = np.lexsort((spans.start[gen], keys))
    keys, starts = keys[order], spans.start[gen][order]
    first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.zeros(0, bool)
    keys, starts = keys[first], starts[first]
    pos = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
    found = (keys[pos] == wanted) if len(keys) else np.zeros(len(wanted), bool)
    return np.where(found, starts[pos] if len(keys) else default, default)


def _named(column: np.ndarray, trace: Trace, name: str) -> np.ndarray:
    k = trace.name_index(name)
    return column == k if k >= 0 else np.zeros(len(column), bool)
