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
from collections import Counter, defaultdict
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path

import numpy as np

from rlx.trace import columnar
from rlx.trace.cache import TraceCache
from rlx.trace.columnar import KindColumns, has_value, take_values
from rlx.trace.model import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNFINISHED,
    AttrColumn,
    Events,
    LaterAttrs,
    Process,
    Spans,
    Trace,
)
from rlx.trace.reader import TraceError, is_trace_file, open_trace, read_trace_columns, read_trace_file

__all__ = ["TraceError", "find_trace_files", "load_trace"]


def find_trace_files(path: str | Path) -> list[Path]:
    """The trace files a path names: the file itself, or the trace files of a (run) directory."""
    path = Path(path)
    if not path.exists():
        run_dir = path.parent if path.name == "trace" else None
        if run_dir is not None and (run_dir / "config.yaml").is_file():  # a run that recorded no trace
            raise FileNotFoundError(
                f"no such trace file or directory: {path}; the run in {run_dir} recorded no "
                "trace (trace.enabled is off in its config); run it again with "
                "trace.enabled=true to record one"
            )
        raise FileNotFoundError(f"no such trace file or directory: {path}")
    if path.is_file():
        return [path]
    files = [f for f in sorted(path.glob("*.jsonl")) if f.is_file() and is_trace_file(f)]  # a FIFO would block
    if not files and (path / "trace").is_dir():
        files = [f for f in sorted((path / "trace").glob("*.jsonl")) if f.is_file() and is_trace_file(f)]
    if not files:
        raise TraceError(
            f"no rlx trace files in {path} (looked for *.jsonl files that start with a "
            f"trace header); record one by setting trace.enabled=true in the run config"
        )
    return files


def load_trace(path: str | Path, cache: bool = True) -> Trace:
    """Read every trace file under ``path`` into one ``Trace``.

    With ``cache`` (and unless ``RLX_TRACE_CACHE=off``), a trace opened before is read from its
    columnar cache (``cache.py``) when the files are unchanged, and a parsed one is cached in a
    background thread for the next time."""
    files = find_trace_files(path)
    store = TraceCache.of(files) if cache else None
    cached = store.load() if store is not None else None
    if cached is not None:
        return cached
    trace = _parse(files)
    if store is not None:
        store.save_in_background(trace)
    return trace


def _parse(files: list[Path]) -> Trace:
    names, requests = _Interner(), _RequestIds()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of new objects and no cycles: collections would only cost time
    try:
        parts = [_FileColumns(f, k, names, requests) for k, f in enumerate(files)]
        requests.finish()
        for part in parts:
            part.resolve_requests()
        return _assemble(parts, names.values(), requests.values)
    finally:
        if gc_was_enabled:
            gc.enable()


class _Interner:
    """Maps names (or, without pyarrow, request ids) to small ints in first-seen order; None maps to -1.

    A ``defaultdict`` whose missing-key factory is its own ``__len__``, looked up
    through ``map``: every step runs in C, with no Python call per item. None is the first key,
    so its id is 0 and every id is shifted down by one.
    """

    def __init__(self) -> None:
        self._ids: defaultdict = defaultdict()
        self._ids.default_factory = self._ids.__len__  # a new key's id: the number of keys before it
        self._ids[None]  # noqa: B018 - id 0, i.e. -1 after the shift

    def ids(self, records: list, attr: str) -> np.ndarray:
        """The id of ``getattr(record, attr)`` for each record."""
        return self.ids_of(map(attrgetter(attr), records), len(records))

    def ids_of(self, values, count: int | None = None) -> np.ndarray:
        """The id of each value (``count`` of them, when ``values`` is an iterator)."""
        n = len(values) if count is None else count
        return (np.fromiter(map(self._ids.__getitem__, values), np.int64, n) - 1).astype(np.int32)

    def values(self) -> list:
        return list(self._ids)[1:]


class _Pending:
    """Request ids waiting to be interned; ``codes`` (int32, -1 = none) once ``_RequestIds.finish`` ran."""

    __slots__ = ("values", "codes")

    def __init__(self, values=None, codes: np.ndarray | None = None) -> None:
        self.values, self.codes = values, codes


class _RequestIds:
    """The request ids of every file, interned together once all files are read.

    A million spans carry half a million distinct request ids. The fast path hands them over as
    pyarrow string columns and the records as Python values; ``finish`` interns them all in one
    ``dictionary_encode`` (in C++, first-seen order, no Python object per id) and keeps the ids as
    an ``ArrowStrings`` sequence. Integer ids (which only the line-by-line reader passes through)
    or a missing pyarrow take the ``_Interner``, with the same order.
    """

    def __init__(self) -> None:
        self._pending: list[_Pending] = []
        self.values: Sequence = []

    def add(self, values) -> _Pending:
        """Queue a pyarrow string array or a list of ids (str, int or None)."""
        pending = _Pending(values)
        self._pending.append(pending)
        return pending

    def add_of(self, records: list) -> _Pending:
        return self.add(list(map(attrgetter("r"), records)))

    @staticmethod
    def none(count: int) -> _Pending:
        return _Pending(codes=np.full(count, -1, np.int32))

    def finish(self) -> None:
        for p in self._pending:
            if not len(p.values):  # a chunked array drops empty chunks: keep the rest aligned
                p.codes = np.zeros(0, np.int32)
        pending = [p for p in self._pending if p.codes is None]
        batches = [p.values for p in pending]
        chunks = _string_arrays(batches)
        if chunks is not None:
            encoded = columnar.pa.chunked_array(chunks, columnar.pa.string()).dictionary_encode()
            codes = [columnar.to_numpy(c.indices, np.int32, -1) for c in encoded.chunks]
            self.values = ArrowStrings(encoded.chunk(0).dictionary) if encoded.num_chunks else []
        else:
            interner = _Interner()
            codes = [interner.ids_of(b if isinstance(b, list) else b.to_pylist()) for b in batches]
            self.values = interner.values()
        if len(codes) != len(pending):
            raise AssertionError(f"{len(codes)} request-id code arrays for {len(pending)} batches")
        for p, c in zip(pending, codes, strict=True):
            p.values, p.codes = None, c
        self._pending = []


def _string_arrays(batches: list) -> list | None:
    """Every batch as a pyarrow string array, or None when one holds a non-string id (or no pyarrow)."""
    if not columnar.arrow():
        return None
    pa = columnar.pa
    try:
        return [pa.array(b, pa.string()) if isinstance(b, list) else b for b in batches]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


class ArrowStrings(Sequence):
    """A pyarrow string array as a read-only sequence of ``str``, converted an item at a time."""

    def __init__(self, array) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._array[i].to_pylist()
        return self._array[i].as_py()

    def __iter__(self):
        return iter(self._array.to_pylist())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None


def _column(records: list, attr: str, dtype: type = np.int64) -> np.ndarray:
    return np.fromiter(map(attrgetter(attr), records), dtype, len(records))


def _lookup(sorted_ids: np.ndarray, order: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index (via ``order``) of each wanted id in the ids, or -1 when absent."""
    if len(sorted_ids) == 0:
        return np.full(len(wanted), -1, np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == wanted, order[pos], -1)


class _Completes:
    """Columns of complete-span records, built chunk by chunk while the reader decodes them."""

    def __init__(self, names: _Interner, requests: _RequestIds) -> None:
        self.names, self.requests = names, requests
        self.chunks: list[dict] = []
        self.attrs: list = []
        self.errors: dict[int, str] = {}
        self.count = 0

    def __call__(self, done: list, has_requests: bool, has_errors: bool) -> None:
        self.chunks.append(
            {
                "i": _column(done, "i"),
                "t": _column(done, "t"),
                "d": _column(done, "d"),
                "p": _column(done, "p"),
                "n": self.names.ids(done, "n"),
                # no request id or error in the chunk's bytes: skip that pass
                "r": self.requests.add_of(done) if has_requests else self.requests.none(len(done)),
            }
        )
        self.attrs += map(attrgetter("a"), done)
        if has_errors:
            self.errors.update({self.count + k: x.err for k, x in enumerate(done) if x.err is not None})
        self.count += len(done)

    @classmethod
    def from_columns(cls, x: KindColumns, names: _Interner, requests: _RequestIds) -> _Completes:
        """The complete spans of a file pyarrow read."""
        done = cls(names, requests)
        done.chunks.append(
            {"i": x.i, "t": x.t, "d": x.d, "p": x.p, "n": _name_ids(names, x), "r": requests.add(x.requests)}
        )
        done.attrs, done.errors, done.count = x.attrs, x.errors, len(x)
        return done

    def request_parts(self) -> list[_Pending]:
        return [c["r"] for c in self.chunks]

    def column(self, key: str) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, np.int32 if key == "n" else np.int64)
        return np.concatenate([c[key] for c in self.chunks])


def _name_ids(names: _Interner, kind: KindColumns) -> np.ndarray:
    return names.ids_of(kind.name_values)[kind.name_codes].astype(np.int32) if len(kind) else np.zeros(0, np.int32)


class _FileColumns:
    """One file's spans and events as columns in the file's own time (ns since its start)."""

    def __init__(self, path: Path, index: int, names: _Interner, requests: _RequestIds) -> None:
        opened = open_trace(path)  # the header first: anything else is refused unread
        columns = read_trace_columns(opened)
        if columns is not None:
            done = _Completes.from_columns(columns.kinds["X"], names, requests)
            begins, ends, instants = (columns.kinds[k] for k in "BEI")
            self.skipped, self.examples = Counter(), []
        else:  # line by line: skips and counts what it cannot use
            done = _Completes(names, requests)
            rec = read_trace_file(opened, done)
            begins, ends, instants = map(KindColumns.of_records, (rec.begins, rec.ends, rec.instants))
            self.skipped, self.examples = rec.skipped, rec.examples
        self.header = header = opened.header
        self.process = Process(
            index=index, name=header.name, role=header.role, pid=header.pid, host=header.host, path=opened.path
        )
        self._spans(done, begins, ends, names, requests)
        self._events(instants, names, requests)
        times = [a.max() for a in (self.start, self.end_known, self.time) if len(a)]
        self.last_t = int(max(times, default=0))
        self.end = np.where(self.status == STATUS_UNFINISHED, self.last_t, self.end_known)

    def _spans(
        self, done: _Completes, begins: KindColumns, ends: KindColumns, names: _Interner, requests: _RequestIds
    ) -> None:
        """Complete spans (one ``X`` line each) first, then the long ones (``B`` [+ ``E``])."""
        done_ids = done.column("i")
        raced = np.isin(begins.i, done_ids)  # a begin line that raced with its complete line: one span
        if raced.any():
            begins = begins.take(np.flatnonzero(~raced))
        ids = np.r_[done_ids, begins.i]
        self._order = np.argsort(ids, kind="stable")
        self._sorted_ids = ids[self._order]
        self.start = np.r_[done.column("t"), begins.t]
        self.name = np.r_[done.column("n"), _name_ids(names, begins)].astype(np.int32)
        self._requests = done.request_parts() + [requests.add(begins.requests)]  # the request column, once interned
        self.begin_attrs = [done.attrs, begins.attrs]  # segments of an AttrColumn
        self.parent = _lookup(self._sorted_ids, self._order, np.r_[done.column("p"), begins.p])
        self.errors = done.errors
        end_of_begin = _lookup(*_sorted(ends.i), begins.i)
        end_times = np.append(ends.t, 0)  # index -1 (no end) reads the 0
        self.end_known = np.r_[self.start[: done.count] + done.column("d"), end_times[end_of_begin]]
        self.status = np.r_[
            np.full(done.count, STATUS_OK), np.where(end_of_begin >= 0, STATUS_OK, STATUS_UNFINISHED)
        ].astype(np.int8)
        self._long_span_ends(ends, begins, end_of_begin, done.count, requests)
        self.status[list(self.errors)] = STATUS_ERROR

    def _long_span_ends(
        self, ends: KindColumns, begins: KindColumns, end_of_begin: np.ndarray, base: int, requests: _RequestIds
    ) -> None:
        """Attributes, errors and late request ids from the end lines of long spans; orphans counted."""
        matched = np.flatnonzero(end_of_begin >= 0)
        rows = end_of_begin[matched]
        if len(ends) > len(matched):
            self.skipped["span end without its begin"] += len(ends) - len(matched)
        self.end_owner, self.end_attrs = base + matched, take_values(ends.attrs, rows)
        span_of_end = np.full(len(ends), -1, np.int64)
        span_of_end[rows] = base + matched
        for row, err in ends.errors.items():
            if span_of_end[row] >= 0:
                self.errors[int(span_of_end[row])] = err
        late = has_value(take_values(ends.requests, rows)) & ~has_value(take_values(begins.requests, matched))
        self._late_requests = base + matched[late], requests.add(take_values(ends.requests, rows[late]))

    def resolve_requests(self) -> None:
        """The request columns, from the codes ``_RequestIds.finish`` gave (a span whose begin
        named no request takes the one its end line named)."""
        self.request = np.concatenate([p.codes for p in self._requests]).astype(np.int32)
        late_spans, late = self._late_requests
        self.request[late_spans] = late.codes
        self.event_request = self._event_requests.codes
        del self._requests, self._late_requests, self._event_requests

    def _events(self, instants: KindColumns, names: _Interner, requests: _RequestIds) -> None:
        self.time = instants.t
        self.event_name = _name_ids(names, instants)
        self._event_requests = requests.add(instants.requests)
        self.event_parent = _lookup(self._sorted_ids, self._order, instants.p)
        self.event_attrs = instants.attrs


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
    parent_request = np.append(spans.request, -1)[events.parent]  # parent -1 reads the -1
    events.request = np.where(events.request < 0, parent_request, events.request).astype(np.int32)
    trace = Trace(
        processes=processes, names=names, request_ids=request_ids, spans=spans, events=events, origin_wall_ns=origin
    )
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
    cat = np.concatenate
    spans = Spans(
        proc=cat([np.full(len(p.start), p.process.index, np.int32) for p in parts]),
        name=cat([p.name for p in parts]).astype(np.int32),
        start=cat([p.start + p.process.offset_ns for p in parts]).astype(np.int64),
        end=cat([p.end + p.process.offset_ns for p in parts]).astype(np.int64),
        parent=cat([_shift(p.parent, b) for p, b in zip(parts, bases, strict=True)]).astype(np.int32),
        depth=np.zeros(sum(len(p.start) for p in parts), np.int16),
        request=cat([p.request for p in parts]).astype(np.int32),
        status=cat([p.status for p in parts]).astype(np.int8),
        begin_attrs=AttrColumn([segment for p in parts for segment in p.begin_attrs]),
    )
    for p, b in zip(parts, bases, strict=True):
        spans.errors.update({s + b: e for s, e in p.errors.items()})
    spans.end_attrs = LaterAttrs(
        cat([p.end_owner + b for p, b in zip(parts, bases, strict=True)]).astype(np.int64),
        AttrColumn([p.end_attrs for p in parts]),
    )
    return spans


def _concat_events(parts: list[_FileColumns]) -> Events:
    bases = _bases([len(p.start) for p in parts])
    cat = np.concatenate
    return Events(
        proc=cat([np.full(len(p.time), p.process.index, np.int32) for p in parts]),
        name=cat([p.event_name for p in parts]).astype(np.int32),
        time=cat([p.time + p.process.offset_ns for p in parts]).astype(np.int64),
        parent=cat([_shift(p.event_parent, b) for p, b in zip(parts, bases, strict=True)]).astype(np.int32),
        request=cat([p.event_request for p in parts]).astype(np.int32),
        attrs=AttrColumn([p.event_attrs for p in parts]),
    )


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
