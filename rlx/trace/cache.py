"""A columnar cache of loaded traces, so that opening a trace a second time parses nothing.

Parsing a million-line trace costs about a second; its columns are tens of megabytes of plain
numpy arrays. After a load, ``TraceCache.save`` writes them (in a background thread) into one
file in the user's cache directory: ``$RLX_TRACE_CACHE``, else ``$XDG_CACHE_HOME/rlx/trace-view``,
else ``~/.cache/rlx/trace-view``; ``RLX_TRACE_CACHE=off`` turns the cache off. A later load of
the same files reads that file instead of parsing.

The cache is never trusted:

- It is found by the trace files' identity: resolved path, device, inode, size, mtime and ctime
  (which no copy tool can set). A file that grows, is rewritten, touched or replaced, and a file
  added to or removed from the directory, each change the key, and the trace is parsed again.
  The cache lives in the user's own directory, never beside the trace, so a trace received from
  someone else cannot bring a cache with it.
- The trace files are still opened as on a first load: each header is checked first, and the
  process names, roles and hosts are taken from those headers, not from the cache.
- The cache file is a fixed magic line, a msgspec-typed JSON manifest and raw arrays whose dtypes
  rlx fixes (the file only says where each array lies), with a CRC-32 over all of it. Every
  index is range-checked (process, name, parent, request, attribute line) before use. Anything
  wrong -- a short or garbled file, a bad checksum, an index out of range -- and the cache is
  ignored, the trace parsed and the cache rewritten. No pickle, no code, no object graph.

Only traces that the fast path read whole are cached (attributes kept as line references into
the trace files); a trace with unusable lines is parsed each time, so its skip counts and
examples stay exact. Old caches are removed beyond ``MAX_CACHE_BYTES``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from rlx.trace.columnar import FileLines, LineAttrs
from rlx.trace.format import Int64
from rlx.trace.model import AttrColumn, Events, LaterAttrs, Process, Spans, Trace
from rlx.trace.reader import open_trace

ENV_CACHE = "RLX_TRACE_CACHE"
CACHE_VERSION = 1
MAGIC = b"rlx-trace-cache\n"
MAX_CACHE_BYTES = 2 << 30
"""Caches beyond this total (the least recently used first) are removed after each write."""
_ALIGN = 64
_PREFIX = len(MAGIC) + 8  # magic, manifest length

_SPAN_COLUMNS = {
    "proc": np.int32,
    "name": np.int32,
    "start": np.int64,
    "end": np.int64,
    "parent": np.int32,
    "depth": np.int16,
    "request": np.int32,
    "status": np.int8,
}
_EVENT_COLUMNS = {"proc": np.int32, "name": np.int32, "time": np.int64, "parent": np.int32, "request": np.int32}
_OTHER_ARRAYS = {"end_owner": np.int64, "request_offsets": np.int64, "request_blob": np.uint8}
_ATTR_KINDS = ("begin_attrs", "end_attrs", "event_attrs")


class _Source(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


class _Array(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    offset: int
    length: int


class _Manifest(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    sources: list[_Source]
    offsets_ns: list[Int64]  # times fit the int64 columns they are added to
    end_ns: list[Int64]
    names: list[str]
    origin_wall_ns: Int64
    num_spans: int
    num_events: int
    span_errors: list[tuple[int, str]]
    segments: dict[str, list[tuple[int, str]]]  # attribute column -> (file, rows array) per segment
    arrays: list[_Array]
    warnings: list[str] = []


class BadCache(ValueError):
    """A cache file that cannot be used as it is."""


def cache_dir() -> Path | None:
    """Where caches live, or None when ``RLX_TRACE_CACHE=off``."""
    configured = os.environ.get(ENV_CACHE, "")
    if configured.lower() in ("off", "0", "false", "no"):
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlx" / "trace-view"


def _source(path: Path) -> _Source:
    st = path.stat()
    return _Source(
        path=str(path.resolve()),
        device=st.st_dev,
        inode=st.st_ino,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
    )


class TraceCache:
    """The cache entry of one set of trace files."""

    def __init__(self, files: list[Path], directory: Path) -> None:
        self.files = files
        self.sources = [_source(f) for f in files]
        where = hashlib.sha256(msgspec.json.encode([s.path for s in self.sources])).hexdigest()[:16]
        what = hashlib.sha256(msgspec.json.encode([CACHE_VERSION, self.sources])).hexdigest()[:32]
        self.path = directory / f"{where}-{what}.rlxtc"  # one entry per set of paths: see _prune

    @classmethod
    def of(cls, files: list[Path]) -> TraceCache | None:
        directory = cache_dir()
        if directory is None:
            return None
        try:
            return cls(files, directory)
        except OSError:
            return None

    # -- reading --------------------------------------------------------------------------

    def load(self) -> Trace | None:
        """The cached trace, or None when there is no usable cache (a bad one is removed)."""
        try:
            buffer = self.path.read_bytes()  # the arrays are read-only views of it
        except OSError:
            return None
        try:
            trace = self._decode(buffer)
        except (BadCache, msgspec.DecodeError, ValueError, IndexError, OverflowError):
            self._remove()
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)  # most recently used: pruned last
        return trace

    def _decode(self, buffer: bytes) -> Trace:
        manifest, arrays = _read(buffer)
        if manifest.version != CACHE_VERSION or manifest.sources != self.sources:
            raise BadCache("the cache describes other files")
        opened = [open_trace(f) for f in self.files]  # each header checked, as on a first load
        num_procs = len(opened)
        if not (len(manifest.offsets_ns) == len(manifest.end_ns) == num_procs):
            raise BadCache("process count")
        spans = {k: arrays[f"span_{k}"] for k in _SPAN_COLUMNS}
        events = {k: arrays[f"event_{k}"] for k in _EVENT_COLUMNS}
        _check_lengths(spans, manifest.num_spans)
        _check_lengths(events, manifest.num_events)
        num_names, num_requests = len(manifest.names), len(arrays["request_offsets"]) - 1
        for columns, parents_of in ((spans, manifest.num_spans), (events, manifest.num_spans)):
            _check_range(columns["proc"], 0, num_procs)
            _check_range(columns["name"], 0, num_names)
            _check_range(columns["parent"], -1, parents_of)
            _check_range(columns["request"], -1, num_requests)
        _check_range(spans["status"], 0, 3)
        _check_range(spans["depth"], 0, 1 << 15)
        owner = arrays["end_owner"]
        _check_range(owner, 0, manifest.num_spans)
        if len(owner) > 1 and not (owner[1:] > owner[:-1]).all():
            raise BadCache("end owners not ascending")
        if not all(0 <= i < manifest.num_spans for i, _ in manifest.span_errors):
            raise BadCache("error of a span out of range")
        request_ids = PackedStrings(arrays["request_blob"], arrays["request_offsets"])
        lines = [FileLines(o.data, o.body_start, o.path) for o in opened]
        attrs = {kind: self._attr_column(manifest, kind, lines, arrays) for kind in _ATTR_KINDS}
        if (len(attrs["begin_attrs"]), len(attrs["end_attrs"]), len(attrs["event_attrs"])) != (
            manifest.num_spans,
            len(owner),
            manifest.num_events,
        ):
            raise BadCache("attribute counts")
        processes = [
            Process(
                index=k,
                name=o.header.name,
                role=o.header.role,
                pid=o.header.pid,
                host=o.header.host,
                path=o.path,
                offset_ns=manifest.offsets_ns[k],
                end_ns=manifest.end_ns[k],
            )
            for k, o in enumerate(opened)
        ]
        return Trace(
            processes=processes,
            names=manifest.names,
            request_ids=request_ids,
            spans=Spans(
                **spans,
                begin_attrs=attrs["begin_attrs"],
                end_attrs=LaterAttrs(owner, attrs["end_attrs"]),
                errors=dict(manifest.span_errors),
            ),
            events=Events(**events, attrs=attrs["event_attrs"]),
            origin_wall_ns=manifest.origin_wall_ns,
            warnings=manifest.warnings,
        )

    @staticmethod
    def _attr_column(manifest: _Manifest, kind: str, lines: list[FileLines], arrays: dict) -> AttrColumn:
        segments = []
        for file, rows_name in manifest.segments.get(kind, []):
            if not 0 <= file < len(lines) or not rows_name.startswith("rows_") or rows_name not in arrays:
                raise BadCache("attribute segment")
            rows = arrays[rows_name]
            _check_range(rows, 0, _count_lines(lines[file]))
            segments.append(LineAttrs(lines[file], rows))
        return AttrColumn(segments)

    # -- writing --------------------------------------------------------------------------

    def save_in_background(self, trace: Trace) -> threading.Thread | None:
        """Write the cache in a thread (not a daemon: the process waits for it before exiting)."""
        if not cacheable(trace):
            return None
        thread = threading.Thread(target=self.save, args=(trace,), name="rlx-trace-cache")
        thread.start()
        return thread

    def save(self, trace: Trace) -> bool:
        """Write the cache file (atomically); False when the trace cannot be cached or writing failed."""
        if not cacheable(trace):
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".writing-", suffix=".rlxtc")
            try:
                with os.fdopen(fd, "wb") as f:
                    self._encode(f, trace)
                os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            _prune(self.path.parent, keep=self.path)
        except OSError:
            return False
        return True

    def _encode(self, f, trace: Trace) -> None:
        spans, events = trace.spans, trace.events
        arrays = {f"span_{k}": getattr(spans, k) for k in _SPAN_COLUMNS}
        arrays |= {f"event_{k}": getattr(events, k) for k in _EVENT_COLUMNS}
        arrays["end_owner"] = spans.end_attrs.owner
        arrays["request_offsets"], arrays["request_blob"] = _pack_strings(trace.request_ids)
        file_of = {p.path: p.index for p in trace.processes}
        segments: dict[str, list[tuple[int, str]]] = {}
        columns = {"begin_attrs": spans.begin_attrs, "end_attrs": spans.end_attrs.attrs, "event_attrs": events.attrs}
        for kind, column in columns.items():
            for segment in column.segments:
                name = f"rows_{len(arrays)}"
                arrays[name] = segment.rows
                segments.setdefault(kind, []).append((file_of[segment.lines.path], name))
        manifest = _Manifest(
            version=CACHE_VERSION,
            sources=self.sources,
            offsets_ns=[p.offset_ns for p in trace.processes],
            end_ns=[p.end_ns for p in trace.processes],
            names=list(trace.names),
            origin_wall_ns=trace.origin_wall_ns,
            num_spans=len(spans),
            num_events=len(events),
            span_errors=sorted(spans.errors.items()),
            segments=segments,
            arrays=[],
            warnings=list(trace.warnings),
        )
        _write(f, manifest, arrays)

    def _remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def cacheable(trace: Trace) -> bool:
    """Only traces read whole by the fast path: every attribute a line reference into a file of the
    trace, nothing skipped, request ids all strings."""
    if trace.num_skipped or trace.skipped_examples:
        return False
    if any(p.index != k for k, p in enumerate(trace.processes)):
        return False
    paths = {p.path for p in trace.processes}
    columns = (trace.spans.begin_attrs, trace.spans.end_attrs.attrs, trace.events.attrs)
    if not all(isinstance(s, LineAttrs) and s.lines.path in paths for c in columns for s in c.segments):
        return False
    ids = trace.request_ids
    return isinstance(ids, PackedStrings) or hasattr(ids, "_array") or all(isinstance(r, str) for r in ids)


def _pack_strings(values) -> tuple[np.ndarray, np.ndarray]:
    """Strings as UTF-8 bytes back to back, and where each starts (n + 1 offsets)."""
    array = getattr(values, "_array", None)  # loader.ArrowStrings: take pyarrow's buffers as they are
    if array is not None and array.offset == 0 and str(array.type) == "string" and not array.null_count:
        offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1).astype(np.int64)
        blob = np.frombuffer(array.buffers()[2], np.uint8, int(offsets[-1])) if len(array) else np.zeros(0, np.uint8)
        return offsets, blob
    if isinstance(values, PackedStrings):
        return values.offsets, values.blob
    encoded = [str(v).encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return offsets, np.frombuffer(b"".join(encoded), np.uint8)


class PackedStrings(Sequence):
    """Strings stored as one UTF-8 blob and offsets: a sequence of ``str`` decoded one at a time."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray) -> None:
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(blob) or (np.diff(offsets) < 0).any():
            raise BadCache("string offsets")
        self.blob, self.offsets = blob, offsets
        self._bytes = blob.tobytes()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"request id {i} out of range ({len(self)})")
        return self._bytes[int(self.offsets[i]) : int(self.offsets[i + 1])].decode("utf-8", "replace")

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None


def _count_lines(lines: FileLines) -> int:
    cached = lines.num_lines
    if cached is None:
        data = memoryview(lines.data)[lines.body_start :] if len(lines.data) else memoryview(b"")
        u = np.frombuffer(data, np.uint8)
        step = 1 << 20
        cached = sum(int(np.count_nonzero(u[k : k + step] == 10)) for k in range(0, len(u), step))
        lines.num_lines = cached
    return cached


def _check_lengths(columns: dict, n: int) -> None:
    if any(len(c) != n for c in columns.values()):
        raise BadCache("column lengths")


def _check_range(values: np.ndarray, lo: int, hi: int) -> None:
    """Every value in [lo, hi)."""
    if len(values) and (int(values.min()) < lo or int(values.max()) >= hi):
        raise BadCache("index out of range")


def _dtype(name: str):
    if name.startswith("span_"):
        return _SPAN_COLUMNS.get(name[5:])
    if name.startswith("event_"):
        return _EVENT_COLUMNS.get(name[6:])
    if name.startswith("rows_"):
        return np.int64
    return _OTHER_ARRAYS.get(name)


def _write(f, manifest: _Manifest, arrays: dict[str, np.ndarray]) -> None:
    """MAGIC, manifest length (8 bytes), manifest, then each array at a 64-byte boundary; CRC-32 last.

    Streamed array by array from numpy's memory (writes and CRC release the GIL), so that a cache
    written in the background slows the viewer's start as little as possible."""
    layout, offset = [], 0
    for name, values in arrays.items():
        layout.append(_Array(name=name, offset=offset, length=len(values)))
        offset += -(-len(values) * np.dtype(_dtype(name)).itemsize // _ALIGN) * _ALIGN
    manifest.arrays = layout
    head = msgspec.json.encode(manifest)
    start = -(-(_PREFIX + len(head)) // _ALIGN) * _ALIGN
    crc = 0
    for chunk in _chunks(head, start, layout, arrays):
        crc = zlib.crc32(chunk, crc)
        f.write(chunk)
    f.write(crc.to_bytes(4, "little"))


def _chunks(head: bytes, start: int, layout: list[_Array], arrays: dict[str, np.ndarray]):
    """The file's bytes before the CRC, in pieces: prefix and manifest, then padding and each array."""
    yield MAGIC + len(head).to_bytes(8, "little") + head + bytes(start - _PREFIX - len(head))
    at = start
    for entry, values in zip(layout, arrays.values(), strict=True):
        if start + entry.offset > at:
            yield bytes(start + entry.offset - at)
            at = start + entry.offset
        data = memoryview(np.ascontiguousarray(values, _dtype(entry.name))).cast("B")
        yield data
        at += len(data)


_manifest_decoder = msgspec.json.Decoder(_Manifest)


def _read(buffer: bytes) -> tuple[_Manifest, dict[str, np.ndarray]]:
    if len(buffer) < _PREFIX + 4 or buffer[: len(MAGIC)] != MAGIC:
        raise BadCache("not a trace cache")
    if zlib.crc32(memoryview(buffer)[:-4]) != int.from_bytes(buffer[-4:], "little"):
        raise BadCache("checksum")
    size = int.from_bytes(buffer[len(MAGIC) : _PREFIX], "little")
    if _PREFIX + size > len(buffer) - 4:
        raise BadCache("manifest length")
    manifest = _manifest_decoder.decode(memoryview(buffer)[_PREFIX : _PREFIX + size])
    start = -(-(_PREFIX + size) // _ALIGN) * _ALIGN
    arrays = {}
    for entry in manifest.arrays:
        dtype = _dtype(entry.name)
        if dtype is None or entry.name in arrays or entry.offset < 0 or entry.length < 0:
            raise BadCache(f"array {entry.name!r}")
        begin = start + entry.offset
        if begin + entry.length * np.dtype(dtype).itemsize > len(buffer) - 4:
            raise BadCache(f"array {entry.name!r} past the end")
        arrays[entry.name] = np.frombuffer(buffer, dtype, entry.length, begin)
    missing = {f"span_{k}" for k in _SPAN_COLUMNS} | {f"event_{k}" for k in _EVENT_COLUMNS} | set(_OTHER_ARRAYS)
    if not missing <= arrays.keys():
        raise BadCache("arrays missing")
    return manifest, arrays


def _prune(directory: Path, keep: Path) -> None:
    """Remove the caches of earlier states of the same files (a trace still being written gets a new
    cache at each open), then the least recently used while they total more than MAX_CACHE_BYTES."""
    entries = []
    same_files = keep.name.split("-")[0] + "-"
    for path in directory.glob("*.rlxtc"):
        try:
            if path != keep and path.name.startswith(same_files):
                path.unlink()
                continue
            st = path.stat()
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= MAX_CACHE_BYTES:
            break
        if path != keep:
            path.unlink(missing_ok=True)
            total -= size
