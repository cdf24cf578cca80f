"""The rows of the timeline: which spans and events each row shows. No Textual here.

Lanes go by process, ordered launcher, rollout servers, trainer ranks, sync (then anything
else), by name within a role. A process has one row per nesting depth for its spans without a
request id, then, if it served requests, a ``requests`` row (how many requests were in flight)
that expands into one row per request (its ``queued``, ``generate``, ``reward``... spans and
events). A filter hides spans and events; request rows left empty are hidden with them.

Rows hold indices into the trace's columns, sorted by start, plus a running maximum of the ends,
so that the spans visible in a window are found with two binary searches whatever the zoom.
Request rows are built on first use: a trace can have hundreds of thousands of requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from rlx.trace.model import Trace
from rlx.trace.perfetto import role_rank

SPANS, REQUESTS, REQUEST = "spans", "requests", "request"


@dataclass(frozen=True)
class RowKey:
    kind: str          # SPANS (one depth of a process), REQUESTS (summary) or REQUEST (one request)
    proc: int
    depth: int = 0     # SPANS: the nesting depth shown
    request: int = -1  # REQUEST: index into trace.request_ids


@dataclass
class RowData:
    spans: np.ndarray      # span indices sorted by start
    starts: np.ndarray
    ends: np.ndarray
    max_end: np.ndarray    # running maximum of ends: spans before i all end by max_end[i-1]
    events: np.ndarray     # event indices sorted by time
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
    return RowData(spans, starts, ends, np.maximum.accumulate(ends) if len(ends) else ends,
                   events, trace.events.time[events])


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


class Lanes:
    """The rows for a trace under a filter, with per-process request rows expandable."""

    def __init__(self, trace: Trace, span_mask: np.ndarray | None = None,
                 event_mask: np.ndarray | None = None) -> None:
        self.trace = trace
        spans, events = trace.spans, trace.events
        self.span_mask = np.ones(len(spans), bool) if span_mask is None else span_mask
        self.event_mask = np.ones(len(events), bool) if event_mask is None else event_mask
        self.order = sorted(range(len(trace.processes)), key=self._process_key)
        self.expanded: set[int] = set()
        self._cache: dict[RowKey, RowData] = {}
        self._group_requests()
        self.rows: list[RowKey] = []
        self.rebuild()

    def _process_key(self, proc: int) -> tuple:
        p = self.trace.processes[proc]
        return role_rank(p.role), _natural(p.name), proc

    def _group_requests(self) -> None:
        """Request spans and events sorted by (process, request, time); the requests of each process."""
        spans, events = self.trace.spans, self.trace.events
        self._num_requests = max(len(self.trace.request_ids), 1)
        req_spans = np.flatnonzero(self.span_mask & (spans.request >= 0))
        span_keys = self._key(spans.proc[req_spans], spans.request[req_spans])
        order = np.lexsort((spans.start[req_spans], span_keys))
        self._req_spans, self._req_span_keys = req_spans[order], span_keys[order]
        req_events = np.flatnonzero(self.event_mask & (events.request >= 0))
        event_keys = self._key(events.proc[req_events], events.request[req_events])
        order = np.lexsort((events.time[req_events], event_keys))
        self._req_events, self._req_event_keys = req_events[order], event_keys[order]
        self.requests_of: dict[int, np.ndarray] = {}
        self._in_flight: dict[int, RowData] = {}
        keys = np.unique(np.r_[self._req_span_keys, self._req_event_keys])
        for proc in np.unique(keys // self._num_requests).tolist():
            self.requests_of[proc] = keys[(keys // self._num_requests) == proc] % self._num_requests
        self._order_requests_by_start()

    def _key(self, procs: np.ndarray, requests: np.ndarray) -> np.ndarray:
        return procs.astype(np.int64) * self._num_requests + requests

    def _slice(self, keys: np.ndarray, lo_key: int, hi_key: int) -> slice:
        lo, hi = np.searchsorted(keys, [lo_key, hi_key])
        return slice(int(lo), int(hi))

    def _order_requests_by_start(self) -> None:
        """Sort each process's requests by their first span start; build the in-flight intervals."""
        spans = self.trace.spans
        keys = self._req_span_keys
        if not len(keys):
            return
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        starts = spans.start[self._req_spans[first]]
        ends = np.maximum.reduceat(spans.end[self._req_spans], first)
        group_keys = keys[first]
        for proc in list(self.requests_of):
            mine = (group_keys // self._num_requests) == proc
            order = np.argsort(starts[mine], kind="stable")
            with_spans = group_keys[mine][order] % self._num_requests
            only_events = np.setdiff1d(self.requests_of[proc], with_spans)
            self.requests_of[proc] = np.r_[with_spans, only_events].astype(np.int64)
            s, e = starts[mine][order], ends[mine][order]
            self._in_flight[proc] = RowData(np.arange(0), s, e, np.maximum.accumulate(e), np.arange(0), np.arange(0))

    def rebuild(self) -> None:
        """Recompute the visible rows (after expanding or collapsing requests)."""
        spans = self.trace.spans
        rows, self._first_rows = [], set()
        for proc in self.order:
            own = self.span_mask & (spans.proc == proc) & (spans.request < 0)
            depths = np.unique(spans.depth[own])
            rows += [RowKey(SPANS, proc, int(d)) for d in (depths if len(depths) else [0])]
            self._first_rows.add(RowKey(SPANS, proc, int(depths[0]) if len(depths) else 0))
            requests = self.requests_of.get(proc)
            if requests is not None and len(requests):
                rows.append(RowKey(REQUESTS, proc))
                if proc in self.expanded:
                    rows += [RowKey(REQUEST, proc, request=int(r)) for r in requests]
        self.rows = rows

    def toggle(self, proc: int) -> None:
        if proc in self.requests_of:
            self.expanded ^= {proc}
            self.rebuild()

    def label(self, key: RowKey) -> str:
        p = self.trace.processes[key.proc]
        if key.kind == SPANS:
            return p.label if key in self._first_rows else f"  {'·' * min(key.depth, 4)}"
        if key.kind == REQUESTS:
            arrow = "▾" if key.proc in self.expanded else "▸"
            return f" {arrow} requests ({len(self.requests_of[key.proc])})"
        return f"   {self.trace.request_ids[key.request]}"

    def data(self, key: RowKey) -> RowData:
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._build(key)
        return cached

    def _build(self, key: RowKey) -> RowData:
        spans, events = self.trace.spans, self.trace.events
        if key.kind == SPANS:
            span_idx = np.flatnonzero(self.span_mask & (spans.proc == key.proc) & (spans.request < 0)
                                      & (spans.depth == key.depth))
            event_idx = np.flatnonzero(self.event_mask & (events.proc == key.proc) & (events.request < 0)) \
                if key in self._first_rows else np.arange(0)
            return _row_data(self.trace, span_idx, event_idx)
        if key.kind == REQUESTS:
            return self._in_flight.get(key.proc) or _row_data(self.trace, np.arange(0), np.arange(0))
        k = key.proc * self._num_requests + key.request
        mine = self._req_spans[self._slice(self._req_span_keys, k, k + 1)]
        ev = self._req_events[self._slice(self._req_event_keys, k, k + 1)]
        return _row_data(self.trace, mine, ev)

    def in_flight(self, proc: int) -> RowData | None:
        """One interval per request of the process (first start to last end), for the summary row."""
        return self._in_flight.get(proc)
