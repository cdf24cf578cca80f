"""The fast path for reading a trace file: pyarrow parses every line straight into columns.

A million complete-span lines decoded into one Python object each, then pulled apart into numpy
columns, cost about three seconds; pyarrow's JSON reader parses the same bytes into typed columns
in C++ on all cores, with no object per line. Attributes are not parsed at all: each span keeps
the byte range of its line in the file (``LineAttrs``), and its ``a`` is decoded the first time
someone looks at it (the details pane, an attribute filter, an export).

This path takes only files it can read exactly: every line a well-typed record of a known kind.
Anything else -- a malformed or truncated line, a blank line, an integer request id, pyarrow not
installed -- returns ``None``, and ``reader.py`` reads the file line by line, skipping and counting
what it cannot use. The two paths give the same trace (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from rlx.trace.format import NO_ATTRS, Header, record_decoder

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
except ImportError:  # the slow path reads every trace
    pa = None

KINDS = ("X", "B", "E", "I")
# what each kind must have (format.py's required fields)
_REQUIRED = {"X": ("i", "n", "t", "d"), "B": ("i", "n", "t"), "E": ("i", "t"), "I": ("n", "t")}


class _AttrsOnly(msgspec.Struct):
    a: msgspec.Raw = NO_ATTRS


_attrs_decoder = msgspec.json.Decoder(_AttrsOnly)


class LineAttrs:
    """The ``a`` of each of some lines of one file, decoded on first use (a sequence of Raw)."""

    __slots__ = ("data", "starts", "ends")

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.starts, self.ends = data, starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k: int) -> msgspec.Raw:
        line = memoryview(self.data)[int(self.starts[k]):int(self.ends[k])]
        return _attrs_decoder.decode(line).a

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    def lines_containing(self, needle: bytes) -> np.ndarray:
        """Indices of the lines whose text contains ``needle`` (a superset of the attribute matches)."""
        if not len(self):
            return np.zeros(0, np.int64)
        data, lo, hi = self.data, int(self.starts[0]), int(self.ends[-1])
        hits, at = [], data.find(needle, lo, hi)
        while at >= 0:
            hits.append(at)
            at = data.find(needle, at + 1, hi)
        if not hits:
            return np.zeros(0, np.int64)
        h = np.asarray(hits, np.int64)
        k = np.searchsorted(self.starts, h, side="right") - 1
        inside = (k >= 0) & (h + len(needle) <= self.ends[np.maximum(k, 0)])  # not in a line of another kind
        return np.unique(k[inside])


@dataclass
class ColumnarFile:
    """One file's records as columns: the complete spans in arrays, the rest as line ranges."""

    header: Header
    # complete spans (k == "X"), in file order
    i: np.ndarray
    t: np.ndarray
    d: np.ndarray
    p: np.ndarray
    name_codes: np.ndarray      # int32 index into name_values
    name_values: list[str]
    requests: "pa.Array"        # string request id of each, null = none (interned across files by the loader)
    errors: dict[int, str]      # complete-span index -> error
    attrs: LineAttrs
    other_records: list         # the B / E / I records, in file order (few: decoded one by one)


def read_columns(data: bytes, header: Header, body_start: int) -> ColumnarFile | None:
    """The file's records as columns, or None when the line-by-line reader must take it."""
    if pa is None:
        return None
    if body_start >= len(data) or not data.endswith(b"\n"):
        return None  # empty, or a last line cut short: the reader counts it
    body = memoryview(data)[body_start:]
    try:
        table = pj.read_json(pa.py_buffer(body), read_options=pj.ReadOptions(block_size=4 << 20),
                             parse_options=pj.ParseOptions(explicit_schema=_schema(),
                                                           unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    newlines = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)
    if table.num_rows != len(newlines):
        return None  # blank lines: the reader counts them
    starts = np.r_[0, newlines[:-1] + 1] + body_start
    ends = newlines + body_start
    kind = table.column("k")
    if not _well_formed(table, kind):
        return None
    complete = pc.equal(kind, "X").to_numpy(zero_copy_only=False)
    x = table.filter(pa.array(complete))
    names = x.column("n").combine_chunks().dictionary_encode()
    err = x.column("err")
    errors = {}
    if err.null_count < len(err):
        rows = np.flatnonzero(pc.is_valid(err).to_numpy(zero_copy_only=False))
        errors = dict(zip(rows.tolist(), err.take(pa.array(rows)).to_pylist()))
    others = np.flatnonzero(~complete)
    try:  # the few records that are not complete spans: all must decode, or take the slow path
        other_records = [record_decoder.decode(data[s:e]) for s, e in zip(starts[others].tolist(), ends[others].tolist())]
    except msgspec.DecodeError:
        return None
    return ColumnarFile(
        header=header,
        i=_ints(x, "i"), t=_ints(x, "t"), d=_ints(x, "d"), p=_ints(x, "p"),
        name_codes=names.indices.to_numpy(zero_copy_only=False).astype(np.int32),
        name_values=names.dictionary.to_pylist(),
        requests=x.column("r").combine_chunks(),
        errors=errors,
        attrs=LineAttrs(data, starts[complete], ends[complete]),
        other_records=other_records)


def _schema():
    return pa.schema([("k", pa.string()), ("i", pa.int64()), ("n", pa.string()), ("t", pa.int64()),
                      ("d", pa.int64()), ("p", pa.int64()), ("r", pa.string()), ("err", pa.string())])


def _well_formed(table, kind) -> bool:
    """Every line of a known kind with the fields that kind requires."""
    if kind.null_count or not pc.all(pc.is_in(kind, pa.array(KINDS))).as_py():
        return False
    for k, fields in _REQUIRED.items():
        rows = pc.equal(kind, k)
        for name in fields:
            if pc.any(pc.and_(rows, pc.is_null(table.column(name)))).as_py():
                return False
    return True


def _ints(table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), 0).combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)
