"""Reading one trace file into records, skipping and counting every line that cannot be used.

A trace may be cut short by a crash, written by a newer rlx, or edited by hand; none of that is
fatal. The whole body is first decoded in one msgspec call (fast: about a microsecond a line);
only when that fails is it decoded line by line, so that each bad line is skipped and counted
with its reason and line number. This module knows nothing of spans' meaning; ``loader.py``
pairs begins with ends and builds the columns.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from rlx.trace.format import (FORMAT_NAME, FORMAT_VERSION, Begin, End, Header, Instant,
                              header_decoder, record_decoder, records_decoder)

MAX_EXAMPLES = 5
_HEADER_PREFIX = b'{"k":"H"'


class TraceError(ValueError):
    """A trace path that cannot be read at all (no trace files, a newer format)."""


@dataclass
class FileRecords:
    path: Path
    header: Header
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
            return f.read(len(_HEADER_PREFIX)) == _HEADER_PREFIX
    except OSError:
        return False


def read_trace_file(path: Path) -> FileRecords:
    """All usable records of one file; raises TraceError if it is not an rlx trace at all."""
    data = Path(path).read_bytes()
    first, _, body = data.partition(b"\n")
    records = FileRecords(path=Path(path), header=_decode_header(path, first))
    tail = b""
    if body and not body.endswith(b"\n"):
        body, _, tail = body.rpartition(b"\n")
        body += b"\n" if body else b""
    if body:
        _read_body(records, body)
    if tail:
        _read_last_line(records, tail, 2 + body.count(b"\n"))
    return records


def _decode_header(path: Path, line: bytes) -> Header:
    try:
        header = header_decoder.decode(line)
    except msgspec.DecodeError:
        raise TraceError(f"{path} is not an rlx trace: its first line is not a trace header; "
                         f"pass a trace directory or a <name>.<pid>.jsonl file it holds") from None
    if header.format != FORMAT_NAME:
        raise TraceError(f"{path} has format {header.format!r}, not {FORMAT_NAME!r}")
    if header.version > FORMAT_VERSION:
        raise TraceError(f"{path} uses trace format version {header.version}, newer than this rlx "
                         f"reads ({FORMAT_VERSION}); upgrade rlx to view it")
    return header


def _read_last_line(records: FileRecords, line: bytes, line_no: int) -> None:
    """A last line without a newline was cut by a crash, unless it still decodes whole."""
    try:
        _add(records, record_decoder.decode(line))
    except msgspec.DecodeError:
        records.skip(line_no, "truncated last line")


def _read_body(records: FileRecords, body: bytes) -> None:
    try:
        decoded = records_decoder.decode(b"[" + body[:-1].replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:
        _read_lines(records, body)
        return
    records.begins = [r for r in decoded if r.__class__ is Begin]
    records.ends = [r for r in decoded if r.__class__ is End]
    records.instants = [r for r in decoded if r.__class__ is Instant]


def _read_lines(records: FileRecords, body: bytes) -> None:
    for line_no, line in enumerate(body[:-1].split(b"\n"), start=2):
        if not line.strip():
            records.skip(line_no, "blank line")
            continue
        try:
            _add(records, record_decoder.decode(line))
        except msgspec.ValidationError as exc:
            records.skip(line_no, f"not a trace record ({_short(exc)})")
        except msgspec.DecodeError:
            records.skip(line_no, "malformed JSON")


def _add(records: FileRecords, record: object) -> None:
    kind = record.__class__
    if kind is Begin:
        records.begins.append(record)
    elif kind is End:
        records.ends.append(record)
    else:
        records.instants.append(record)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 60 else text[:57] + "..."
