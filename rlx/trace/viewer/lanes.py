"""The rows of the timeline: which spans and events each row shows. No Textual here.

Lanes go by process, ordered launcher, rollout servers, trainer ranks, sync (then anything
else), by name within a role. A process has one row per nesting depth for its spans without a
request id, then, if it served requests, a ``requests`` row (how many requests were in flight)
that expands into one row per request in flight in the time window (its ``queued``,
``generate``, ``reward``... spans and events), so that zooming onto a step lists that step's
requests. A filter hides spans and events; request rows left empty are hidden with them.

Rows hold indices into the trace's columns, sorted by start, plus a running maximum of the ends,
so that the spans visible in a window are found with two binary searches whatever the zoom.
Rows are built when first drawn, per-request rows on first expansion: a trace can have hundreds
of thousands of requests. The ``requests`` row counts each request's root spans (``queued``,
``generate``...) that overlap a cell, so a request that changes phase inside one cell counts twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from rlx.trace.model import Trace
from rlx.trace.perfetto import role_rank

SPANS, REQUESTS, REQUEST = "spans", "requests", "request"
_MAX_SEEN = 1 << 27
"""Above this many (process, request id) pairs, requests are counted by sorting instead of marking."""


@dataclass(frozen=True)
class RowKey:
    kind: str  # SPANS (one depth of a process), REQUESTS (summary) or REQUEST (one request)
    proc: int
    depth: int = 0  # SPANS: the nesting depth shown
    request: int = -1  # REQUEST: index into trace.request_ids


@dataclass
class RowData:
    spans: np.ndarray  # span indices sorted by start
    starts: np.ndarray
    ends: np.ndarray
    max_end: np.ndarray  # running maximum of ends: spans before i all end by max_end[i-1]
    events: np.ndarray  # event indices sorted by time
    event_times: np.ndarray

    def visible(self, t0: float, t1: float) -> np.ndarray:
        """Positions (into self.spans) of spans overlapping [t0, t1]."""
        hi = int(np.searchsorted(self.starts, t1, side="right"))
        lo = int(np.searchsorted(self.max_end, t0, side="left"))
        if lo >= hi:
            return np.arange(0)
        pos = np.arange(lo, hi)
        return pos[self.ends[lo:hi] >= t0]

    def visible_events(self, t0: float, t1: float) -> np.ndarray:
        lo, hi = np.searchsorted(self.event_times, [t0, t1 + 1])
        return np.arange(lo, hi)


def _row_data(trace: Trace, spans: np.ndarray, events: np.ndarray) -> RowData:
    spans = spans[np.argsort(trace.spans.start[spans], kind="stable")]
    events = events[np.argsort(trace.events.time[events], kind="stable")]
    starts, ends = trace.spans.start[spans], trace.spans.end[spans]
    return RowData(
        spans, starts, ends, np.maximum.accumulate(ends) if len(ends) else ends, events, trace.events.time[events]
    )


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


class Lanes:
    """The rows for a trace under a filter, with per-process request rows expandable.

    Opening a trace computes only what the first frame shows: the depths of each process, how
    many requests each served, and the ``requests`` rows (each request's root spans, which
    overlap exactly while it is in flight). Grouping spans per request waits for the first
    expansion.
    """

    def __init__(self, trace: Trace, span_mask: np.ndarray | None = None, event_mask: np.ndarray | None = None) -> None:
        self.trace = trace
        spans, events = trace.spans, trace.events
        self.span_mask = np.ones(len(spans), bool) if span_mask is None else span_mask
        self.event_mask = np.ones(len(events), bool) if event_mask is None else event_mask
        self.order = sorted(range(len(trace.processes)), key=self._process_key)
        self.expanded: set[int] = set()
        self._cache: dict[RowKey, RowData] = {}
        self._width = max(len(trace.request_ids), 1)
        self._grouped = False
        self.window: tuple[float, float] | None = None
        self._count_requests()
        self._find_depths()
        self.rows: list[RowKey] = []
        self.rebuild()

    def _process_key(self, proc: int) -> tuple:
        p = self.trace.processes[proc]
        return role_rank(p.role), _natural(p.name), proc

    def _key(self, procs: np.ndarray, requests: np.ndarray) -> np.ndarray:
        return procs.astype(np.int64) * self._width + requests

    def _count_requests(self) -> None:
        spans, events = self.trace.spans, self.trace.events
        self._req_spans = np.flatnonzero(self.span_mask & (spans.request >= 0))
        self._req_events = np.flatnonzero(self.event_mask & (events.request >= 0))
        keys = np.r_[
            self._key(spans.proc[self._req_spans], spans.request[self._req_spans]),
            self._key(events.proc[self._req_events], events.request[self._req_events]),
        ]
        num_procs = len(self.trace.processes)
        if num_procs * self._width <= _MAX_SEEN:  # mark each (process, request) pair: no sort
            seen = np.zeros(num_procs * self._width, bool)
            seen[keys] = True
            counts = np.count_nonzero(seen.reshape(num_procs, self._width), axis=1)
        else:
            counts = np.bincount(np.unique(keys) // self._width, minlength=num_procs)
        self.num_requests = {p: int(c) for p, c in enumerate(counts.tolist()) if c}

    def _find_depths(self) -> None:
        spans = self.trace.spans
        own = self.span_mask & (spans.request < 0)
        seen = np.zeros((len(self.trace.processes), int(spans.depth.max(initial=0)) + 1), bool)
        seen[spans.proc[own], spans.depth[own]] = True  # no sort
        self._depths = {p: np.flatnonzero(row).tolist() for p, row in enumerate(seen)}

    def requests_of(self, proc: int) -> np.ndarray:
        """The process's request indices (into trace.request_ids) that pass the filter, by first start."""
        self._group_requests()
        return self._requests_of.get(proc, np.arange(0))

    def _group_requests(self) -> None:
        """Request spans and events sorted by (process, request, time), for per-request rows."""
        if self._grouped:
            return
        spans, events = self.trace.spans, self.trace.events
        keys = self._key(spans.proc[self._req_spans], spans.request[self._req_spans])
        order = np.lexsort((spans.start[self._req_spans], keys))
        self._req_spans, self._req_span_keys = self._req_spans[order], keys[order]
        keys = self._key(events.proc[self._req_events], events.request[self._req_events])
        order = np.lexsort((events.time[self._req_events], keys))
        self._req_events, self._req_event_keys = self._req_events[order], keys[order]
        first = np.r_[True, self._req_span_keys[1:] != self._req_span_keys[:-1]][: len(self._req_span_keys)]
        group_keys, starts = self._req_span_keys[first], spans.start[self._req_spans[first]]
        ends = np.maximum.reduceat(spans.end[self._req_spans], np.flatnonzero(first)) if len(first) else starts
        only_events = np.setdiff1d(self._req_event_keys, group_keys)
        self._requests_of, self._spans_of = {}, {}
        for proc in self.num_requests:
            mine = (group_keys // self._width) == proc
            order = np.argsort(starts[mine], kind="stable")
            extra = only_events[(only_events // self._width) == proc]
            self._requests_of[proc] = np.r_[group_keys[mine][order], extra] % self._width
            # first start and last end of each request with spans; event-only requests always show
            inf = np.full(len(extra), np.inf)
            self._spans_of[proc] = (np.r_[starts[mine][order], -inf], np.r_[ends[mine][order], inf])
        self._grouped = True

    def set_window(self, t0: float, t1: float) -> bool:
        """Expanded processes list only requests in flight in [t0, t1]; True if the rows changed."""
        self.window = (t0, t1)
        if not self.expanded:
            return False
        before = self.rows
        self.rebuild()
        return self.rows != before

    def requests_in_view(self, proc: int) -> np.ndarray:
        requests = self.requests_of(proc)
        if self.window is None:
            return requests
        first, last = self._spans_of[proc]
        return requests[(first <= self.window[1]) & (last >= self.window[0])]

    def _slice(self, keys: np.ndarray, key: int) -> slice:
        lo, hi = np.searchsorted(keys, [key, key + 1])
        return slice(int(lo), int(hi))

    def rebuild(self) -> None:
        """Recompute the visible rows (after expanding or collapsing requests)."""
        rows, self._first_rows = [], set()
        for proc in self.order:
            depths = self._depths[proc] or [0]
            rows += [RowKey(SPANS, proc, d) for d in depths]
            self._first_rows.add(RowKey(SPANS, proc, depths[0]))
            if self.num_requests.get(proc):
                rows.append(RowKey(REQUESTS, proc))
                if proc in self.expanded:
                    rows += [RowKey(REQUEST, proc, request=r) for r in self.requests_in_view(proc).tolist()]
        self.rows = rows

    def toggle(self, proc: int) -> None:
        if self.num_requests.get(proc):
            self.expanded ^= {proc}
            self.rebuild()

    def label(self, key: RowKey) -> str:
        p = self.trace.processes[key.proc]
        if key.kind == SPANS:
            return p.label if key in self._first_rows else f"  {'·' * min(key.depth, 4)}"
        if key.kind == REQUESTS:
            if key.proc not in self.expanded:
                return f" ▸ requests ({self.num_requests[key.proc]})"
            return f" ▾ requests {len(self.requests_in_view(key.proc))}/{self.num_requests[key.proc]} in view"
        return f"   {self.trace.request_ids[key.request]}"

    def data(self, key: RowKey) -> RowData:
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._build(key)
        return cached

    def _build(self, key: RowKey) -> RowData:
        spans, events = self.trace.spans, self.trace.events
        if key.kind == SPANS:
            span_idx = np.flatnonzero(
                self.span_mask & (spans.proc == key.proc) & (spans.request < 0) & (spans.depth == key.depth)
            )
            event_idx = (
                np.flatnonzero(self.event_mask & (events.proc == key.proc) & (events.request < 0))
                if key in self._first_rows
                else np.arange(0)
            )
            return _row_data(self.trace, span_idx, event_idx)
        if key.kind == REQUESTS:
            return self._in_flight(key.proc)
        self._group_requests()
        k = key.proc * self._width + key.request
        mine = self._req_spans[self._slice(self._req_span_keys, k)]
        ev = self._req_events[self._slice(self._req_event_keys, k)]
        return _row_data(self.trace, mine, ev)

    def _in_flight(self, proc: int) -> RowData:
        """The root spans of each request (parent outside the request): they overlap while it runs."""
        spans = self.trace.spans
        mine = self._req_spans[spans.proc[self._req_spans] == proc]
        parents = spans.parent[mine]
        root = (parents < 0) | (spans.request[np.maximum(parents, 0)] != spans.request[mine])
        return _row_data(self.trace, mine[root], np.arange(0))
