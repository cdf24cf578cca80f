"""Reading one trace file into records, skipping and counting every line that cannot be used.

A trace may be cut short by a crash, written by a newer rlx, or edited by hand; none of that is
fatal. A file that is not a trace at all is refused from its first line alone (``open_trace``),
before anything else is read: a 64 GB file of something else costs one ``readline`` of at most
``MAX_HEADER_BYTES``. The body is then memory-mapped, not read: the page cache holds it, the
process only what it decodes. It is decoded a few megabytes at a time, each chunk in one
msgspec call (fast: about a microsecond a line); only a chunk where that fails is decoded line
by line, so that each bad line is skipped and counted with its reason and line number. A line
longer than ``MAX_LINE_BYTES`` is no trace record: it is an error naming the file and line.
This module knows nothing of spans' meaning; ``loader.py`` pairs begins with ends and builds
the columns.

The map is read-only and the tracer only appends, so a trace still being written is fine; a
file truncated by someone else while it is open is not (the OS then faults the reader).
"""

from __future__ import annotations

import mmap
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from rlx.trace.columnar import ColumnarFile, read_columns
from rlx.trace.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Begin,
    Complete,
    End,
    Header,
    Instant,
    header_decoder,
    record_decoder,
    records_decoder,
)

MAX_EXAMPLES = 5
CHUNK_BYTES = 4 << 20
MAX_HEADER_BYTES = 64 << 10
"""A header line is about 200 bytes; a first line longer than this is not one."""
MAX_LINE_BYTES = 64 << 20
"""A record line is a few hundred bytes (attributes are scalars or short lists)."""


class TraceError(ValueError):
    """A trace path that cannot be read at all (no trace files, a newer format, an absurd line)."""


@dataclass
class TraceBytes:
    """An opened trace file: its header and its bytes (``mmap``, or ``b""`` when there is no body)."""

    path: Path
    header: Header
    data: bytes | mmap.mmap
    body_start: int


def open_trace(path: Path) -> TraceBytes:
    """Check the first line, then map the file; TraceError if it is not an rlx trace."""
    with open(path, "rb") as f:
        first = f.readline(MAX_HEADER_BYTES)
        header = _decode_header(path, first.rstrip(b"\n"))
        size = os.fstat(f.fileno()).st_size
        if not first.endswith(b"\n") or size <= len(first):
            return TraceBytes(Path(path), header, b"", len(first))
        return TraceBytes(Path(path), header, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), len(first))


@dataclass
class FileRecords:
    path: Path
    header: Header
    completes: list = field(default_factory=list)
    begins: list = field(default_factory=list)
    ends: list = field(default_factory=list)
    instants: list = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def skip(self, line_no: int, reason: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{self.path.name}:{line_no}: {reason}")


def is_trace_file(path: Path) -> bool:
    """True when the file starts with an rlx trace header line."""
    try:
        with open(path, "rb") as f:
            first = f.readline(MAX_HEADER_BYTES)
        header_decoder.decode(first)
    except (OSError, msgspec.DecodeError):
        return False
    return True


def read_trace_file(source: Path | TraceBytes, sink: Callable | None = None) -> FileRecords:
    """All usable records of one file; raises TraceError if it is not an rlx trace at all.

    The body is decoded in chunks of about ``CHUNK_BYTES``. With a ``sink``, each chunk's
    complete-span records go to ``sink(records, has_requests, has_errors)`` instead of
    ``FileRecords.completes``: a reader that turns them into columns right away works on data
    still in the CPU cache, and the chunk's objects are freed before the next is decoded.
    """
    opened = source if isinstance(source, TraceBytes) else open_trace(source)
    records = FileRecords(path=opened.path, header=opened.header)
    data, start = opened.data, opened.body_start
    while start < len(data):
        end = _chunk_end(opened, start)
        if data[end - 1 : end] != b"\n":  # the last line, cut by a crash
            _read_last_line(records, data[start:end], 2 + _count_newlines(data, opened.body_start, start))
            break
        _read_chunk(records, data, start, end, sink)
        start = end
    return records


def _chunk_end(opened: TraceBytes, start: int) -> int:
    """Where the chunk from ``start`` ends: after the first newline at or past ``CHUNK_BYTES``,
    else after the file's last newline, else at the end of the file (a last line cut short)."""
    data, size = opened.data, len(opened.data)
    search_from = min(start + CHUNK_BYTES, size) - 1
    end = data.find(b"\n", search_from, search_from + MAX_LINE_BYTES) + 1
    if end:
        return end
    if search_from + MAX_LINE_BYTES < size:
        line_start = data.rfind(b"\n", start, search_from) + 1 or start
        line_no = 2 + _count_newlines(data, opened.body_start, line_start)
        raise TraceError(
            f"{opened.path}:{line_no}: a line longer than {MAX_LINE_BYTES >> 20} MiB is no "
            f"trace record; the file is damaged or not a trace (move it out of the trace directory)"
        )
    return data.rfind(b"\n", start, size) + 1 or size


def _count_newlines(data, start: int, end: int) -> int:
    """Newlines in data[start:end], a chunk at a time (an mmap has no ``count``)."""
    return sum(data[k : min(k + CHUNK_BYTES, end)].count(b"\n") for k in range(start, end, CHUNK_BYTES))


def read_trace_columns(source: Path | TraceBytes) -> ColumnarFile | None:
    """The fast path (``columnar.py``): the file as columns, or None when only the line-by-line
    reader can take it (bad or blank lines, a cut last line, an unusual field type, no pyarrow).
    Raises TraceError like ``read_trace_file`` when the file is not an rlx trace at all."""
    opened = source if isinstance(source, TraceBytes) else open_trace(source)
    if not opened.data:
        return None
    return read_columns(opened.data, opened.header, opened.body_start, opened.path)


def _decode_header(path: Path, line: bytes) -> Header:
    try:
        header = header_decoder.decode(line)
    except msgspec.DecodeError:
        raise TraceError(
            f"{path} is not an rlx trace: its first line is not a trace header; "
            f"pass a trace directory or a <name>.<pid>.jsonl file it holds"
        ) from None
    if header.format != FORMAT_NAME:
        raise TraceError(f"{path} has format {header.format!r}, not {FORMAT_NAME!r}")
    if header.version > FORMAT_VERSION:
        raise TraceError(
            f"{path} uses trace format version {header.version}, newer than this rlx "
            f"reads ({FORMAT_VERSION}); upgrade rlx to view it"
        )
    return header


def _read_last_line(records: FileRecords, line: bytes, line_no: int) -> None:
    """A last line without a newline was cut by a crash, unless it still decodes whole."""
    try:
        add_record(records, record_decoder.decode(line))
    except msgspec.DecodeError:
        records.skip(line_no, "truncated last line")


def _read_chunk(records: FileRecords, data: bytes, start: int, end: int, sink: Callable | None) -> None:
    """Lines data[start:end] (ending in a newline) decoded as one JSON array: one msgspec call."""
    array = bytearray(b"[")
    array += memoryview(data)[start : end - 1]
    array += b"]"
    try:
        decoded = records_decoder.decode(array.replace(b"\n", b","))
    except msgspec.DecodeError:
        decoded = _read_lines(records, data[start:end], 1 + _count_newlines(data, 0, start))
    completes = [r for r in decoded if r.__class__ is Complete]
    if sink is None:
        records.completes += completes
    else:
        sink(completes, data.find(b'"r":', start, end) >= 0, data.find(b'"err":', start, end) >= 0)
    if len(completes) < len(decoded):
        rest = [r for r in decoded if r.__class__ is not Complete]  # few: long spans and events
        records.begins += [r for r in rest if r.__class__ is Begin]
        records.ends += [r for r in rest if r.__class__ is End]
        records.instants += [r for r in rest if r.__class__ is Instant]


def _read_lines(records: FileRecords, body: bytes, first_line_no: int) -> list:
    """Line by line: the good records, with each bad line skipped and counted."""
    good = []
    for line_no, line in enumerate(body[:-1].split(b"\n"), start=first_line_no):
        if not line.strip():
            records.skip(line_no, "blank line")
            continue
        try:
            good.append(record_decoder.decode(line))
        except msgspec.ValidationError as exc:
            records.skip(line_no, f"not a trace record ({_short(exc)})")
        except msgspec.DecodeError:
            records.skip(line_no, "malformed JSON")
    return good


def add_record(records: FileRecords, record: object) -> None:
    kind = record.__class__
    if kind is Complete:
        records.completes.append(record)
    elif kind is Begin:
        records.begins.append(record)
    elif kind is End:
        records.ends.append(record)
    else:
        records.instants.append(record)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 60 else text[:57] + "..."
