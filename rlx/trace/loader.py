"""Loading a trace directory (or one file) into columns on one timeline.

``load_trace(path)`` accepts a trace directory, a run directory holding ``trace/``, or one
``<name>.<pid>.jsonl`` file. Each file is read by ``reader.py``; here begins are paired with
ends (vectorised: sort and ``searchsorted``, no per-span Python dict), parents are resolved to
span indices, depth and request ids are propagated down the span tree, and every process is
shifted onto the common clock (``header.wall_ns`` relative to the earliest process).

What cannot be used is skipped and counted in ``Trace.skipped``: malformed or truncated lines,
an end whose begin is missing. A span that began but never ended (a crash, a hang) is kept,
marked unfinished, and drawn up to the last time its process wrote.
"""

from __future__ import annotations

import gc
from operator import attrgetter
from pathlib import Path

import numpy as np

from rlx.trace.model import STATUS_ERROR, STATUS_OK, STATUS_UNFINISHED, Events, Process, Spans, Trace
from rlx.trace.reader import FileRecords, TraceError, is_trace_file, read_trace_file

__all__ = ["TraceError", "find_trace_files", "load_trace"]


def find_trace_files(path: str | Path) -> list[Path]:
    """The trace files a path names: the file itself, or the trace files of a (run) directory."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such trace file or directory: {path}")
    if path.is_file():
        return [path]
    files = [f for f in sorted(path.glob("*.jsonl")) if is_trace_file(f)]
    if not files and (path / "trace").is_dir():
        files = [f for f in sorted((path / "trace").glob("*.jsonl")) if is_trace_file(f)]
    if not files:
        raise TraceError(f"no rlx trace files in {path} (looked for *.jsonl files that start with a "
                         f"trace header); record one by setting trace.enabled=true in the run config")
    return files


def load_trace(path: str | Path) -> Trace:
    """Read every trace file under ``path`` into one ``Trace``."""
    files = find_trace_files(path)
    names, requests = _Interner(), _Interner()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of new objects and no cycles: collections would only cost time
    try:
        parts = [_FileColumns(read_trace_file(f), k, names, requests) for k, f in enumerate(files)]
        return _assemble(parts, names.values(), requests.values())
    finally:
        if gc_was_enabled:
            gc.enable()


class _Interner:
    """Maps names (or request ids) to small ints in first-seen order; None maps to -1.

    Built from ``dict.fromkeys``, comprehensions and ``map`` over a bound method: no Python
    function call per item, which matters for a million spans.
    """

    def __init__(self) -> None:
        self._index: dict = {None: -1}

    def ids(self, items: list) -> np.ndarray:
        index = self._index
        fresh = [k for k in dict.fromkeys(items) if k not in index]
        index.update(zip(fresh, range(len(index) - 1, len(index) - 1 + len(fresh))))
        return np.fromiter(map(index.__getitem__, items), np.int32, len(items))

    def values(self) -> list:
        return [k for k in self._index if k is not None]


def _column(records: list, attr: str, dtype: type = np.int64) -> np.ndarray:
    return np.fromiter(map(attrgetter(attr), records), dtype, len(records))


def _lookup(sorted_ids: np.ndarray, order: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index (via ``order``) of each wanted id in the ids, or -1 when absent."""
    if len(sorted_ids) == 0:
        return np.full(len(wanted), -1, np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == wanted, order[pos], -1)


class _FileColumns:
    """One file's spans and events as columns in the file's own time (ns since its start)."""

    def __init__(self, rec: FileRecords, index: int, names: _Interner, requests: _Interner) -> None:
        self.header, self.skipped, self.examples = rec.header, rec.skipped, rec.examples
        self.process = Process(index=index, name=rec.header.name, role=rec.header.role,
                               pid=rec.header.pid, host=rec.header.host, path=rec.path)
        self._spans(rec, names, requests)
        self._events(rec, names, requests)
        times = [a.max() for a in (self.start, self.end_known, self.time) if len(a)]
        self.last_t = int(max(times, default=0))
        self.end = np.where(self.status == STATUS_UNFINISHED, self.last_t, self.end_known)

    def _spans(self, rec: FileRecords, names: _Interner, requests: _Interner) -> None:
        begins, ends = rec.begins, rec.ends
        ids = _column(begins, "i")
        self._order = np.argsort(ids, kind="stable")
        self._sorted_ids = ids[self._order]
        self.start = _column(begins, "t")
        self.name = names.ids([b.n for b in begins])
        self.request = requests.ids([b.r for b in begins])
        self.begin_attrs = [b.a for b in begins]
        self.parent = _lookup(self._sorted_ids, self._order, _column(begins, "p"))
        end_ids = _column(ends, "i")
        self.end_index = _lookup(*_sorted(end_ids), ids)
        end_times = np.append(_column(ends, "t"), 0)  # index -1 (no end) reads the 0
        self.end_known = end_times[self.end_index]
        self.status = np.where(self.end_index >= 0, STATUS_OK, STATUS_UNFINISHED).astype(np.int8)
        self.end_attrs = [e.a for e in ends]
        self._end_details(ends, _lookup(self._sorted_ids, self._order, end_ids), requests)

    def _end_details(self, ends: list, span_of_end: np.ndarray, requests: _Interner) -> None:
        """Errors and late request ids (rare, so a loop over just those), and orphan ends."""
        missing = int((span_of_end < 0).sum())
        if missing:
            self.skipped["span end without its begin"] += missing
        self.errors = {}
        for k, e in [(k, e) for k, e in enumerate(ends) if e.err is not None or e.r is not None]:
            s = int(span_of_end[k])
            if s >= 0 and e.err is not None:
                self.errors[s] = e.err
                self.status[s] = STATUS_ERROR
            if s >= 0 and e.r is not None and self.request[s] < 0:
                self.request[s] = requests.ids([e.r])[0]

    def _events(self, rec: FileRecords, names: _Interner, requests: _Interner) -> None:
        instants = rec.instants
        self.time = _column(instants, "t")
        self.event_name = names.ids([e.n for e in instants])
        self.event_request = requests.ids([e.r for e in instants])
        self.event_parent = _lookup(self._sorted_ids, self._order, _column(instants, "p"))
        self.event_attrs = [e.a for e in instants]


def _sorted(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(ids, kind="stable")
    return ids[order], order


def _assemble(parts: list[_FileColumns], names: list[str], request_ids: list) -> Trace:
    origin = min(p.header.wall_ns for p in parts)
    processes = []
    for p in parts:
        p.process.offset_ns = p.header.wall_ns - origin
        p.process.end_ns = p.process.offset_ns + p.last_t
        processes.append(p.process)
    spans, events = _concat_spans(parts), _concat_events(parts)
    _propagate(spans)
    events.request = np.where((events.request < 0) & (events.parent >= 0),
                              spans.request[np.maximum(events.parent, 0)], events.request)
    trace = Trace(processes=processes, names=names, request_ids=request_ids, spans=spans,
                  events=events, origin_wall_ns=origin)
    for p in parts:
        trace.skipped.update(p.skipped)
        trace.skipped_examples.extend(p.examples)
    return trace


def _bases(lengths: list[int]) -> list[int]:
    return [int(x) for x in np.concatenate([[0], np.cumsum(lengths)[:-1]])] if lengths else []


def _shift(index: np.ndarray, base: int) -> np.ndarray:
    return np.where(index >= 0, index + base, -1)


def _concat_spans(parts: list[_FileColumns]) -> Spans:
    bases = _bases([len(p.start) for p in parts])
    end_bases = _bases([len(p.end_attrs) for p in parts])
    cat = np.concatenate
    spans = Spans(
        proc=cat([np.full(len(p.start), p.process.index, np.int32) for p in parts]),
        name=cat([p.name for p in parts]).astype(np.int32),
        start=cat([p.start + p.process.offset_ns for p in parts]).astype(np.int64),
        end=cat([p.end + p.process.offset_ns for p in parts]).astype(np.int64),
        parent=cat([_shift(p.parent, b) for p, b in zip(parts, bases)]).astype(np.int32),
        depth=np.zeros(sum(len(p.start) for p in parts), np.int16),
        request=cat([p.request for p in parts]).astype(np.int32),
        status=cat([p.status for p in parts]).astype(np.int8),
        begin_attrs=[a for p in parts for a in p.begin_attrs],
        end_index=cat([_shift(p.end_index, b) for p, b in zip(parts, end_bases)]).astype(np.int32),
        end_attrs=[a for p in parts for a in p.end_attrs])
    for p, b in zip(parts, bases):
        spans.errors.update({s + b: e for s, e in p.errors.items()})
    return spans


def _concat_events(parts: list[_FileColumns]) -> Events:
    bases = _bases([len(p.start) for p in parts])
    cat = np.concatenate
    return Events(
        proc=cat([np.full(len(p.time), p.process.index, np.int32) for p in parts]),
        name=cat([p.event_name for p in parts]).astype(np.int32),
        time=cat([p.time + p.process.offset_ns for p in parts]).astype(np.int64),
        parent=cat([_shift(p.event_parent, b) for p, b in zip(parts, bases)]).astype(np.int32),
        request=cat([p.event_request for p in parts]).astype(np.int32),
        attrs=[a for p in parts for a in p.event_attrs])


def _propagate(spans: Spans) -> None:
    """Depth from the parent chain; a span without a request id takes its parent's."""
    ancestor = spans.parent.copy()
    for _ in range(256):  # deeper nesting than this is a cycle in a hand-edited file
        has = ancestor >= 0
        if not has.any():
            break
        spans.depth[has] += 1
        ancestor[has] = spans.parent[ancestor[has]]
    for _ in range(int(spans.depth.max(initial=0))):
        inherit = (spans.request < 0) & (spans.parent >= 0)
        if not inherit.any():
            break
        spans.request[inherit] = spans.request[spans.parent[inherit]]
