"""The fast path for reading a trace file: pyarrow parses every line straight into columns.

A million complete-span lines decoded into one Python object each, then pulled apart into numpy
columns, cost about three seconds; pyarrow's JSON reader parses the same bytes into typed columns
in C++ on all cores, with no object per line. Every kind of record becomes columns of its own
(``KindColumns``): a real run writes about as many instant events (``queued``) and begin/end
pairs (generations longer than a second) as complete spans, and decoding those one by one
cost more than parsing everything else. Attributes are not parsed at all: each record keeps
the byte range of its line in the file (``LineAttrs``), and its ``a`` is decoded the first time
someone looks at it (the details pane, an attribute filter, an export).

This path takes only files it can read exactly: every line a well-typed record of a known kind.
Anything else -- a malformed or truncated line, a blank line, an integer request id, pyarrow not
installed -- returns ``None``, and ``reader.py`` reads the file line by line, skipping and counting
what it cannot use. The two paths give the same trace (tested).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass

import msgspec
import numpy as np

from rlx.trace.format import NO_ATTRS, Header

pa = pj = None
"""pyarrow and its JSON reader, imported by ``arrow()`` on first use: a trace re-opened from its
cache (``cache.py``) needs neither, and that import is a tenth of a second."""


def arrow() -> bool:
    """Import pyarrow for the fast path; False when it is not installed (the slow path reads every
    trace). ``pyarrow.compute``, which pyarrow imports on the first ``take`` or encode (a tenth of
    a second of Python), is imported in a thread meanwhile, while the first file parses in C++."""
    global pa, pj
    if pa is None:
        try:
            import pyarrow
            import pyarrow.json
        except ImportError:
            return False
        threading.Thread(target=importlib.import_module, args=("pyarrow.compute",), name="rlx-arrow-import").start()
        pa, pj = pyarrow, pyarrow.json
    return True


KINDS = ("X", "B", "E", "I")
# what each kind must have (format.py's required fields)
_REQUIRED = {"X": ("i", "n", "t", "d"), "B": ("i", "n", "t"), "E": ("i", "t"), "I": ("n", "t")}


class _AttrsOnly(msgspec.Struct):
    a: msgspec.Raw = NO_ATTRS


_attrs_decoder = msgspec.json.Decoder(_AttrsOnly)


class FileLines:
    """Where each line of a file's body starts and ends (its newline), found on first use: the
    first frame needs no attribute, and finding a million lines costs more than counting them."""

    def __init__(self, data, body_start: int, path=None) -> None:
        self.data, self.body_start, self.path = data, body_start, path
        self.num_lines: int | None = None
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if self._bounds is None:
            starts, ends = _line_bounds(memoryview(self.data)[self.body_start :])
            self._bounds = starts + self.body_start, ends + self.body_start
        return self._bounds


class LineAttrs:
    """The ``a`` of some lines (``rows``, by index in the body) of one file, decoded on first use
    (a sequence of Raw)."""

    __slots__ = ("lines", "rows", "_starts", "_ends")

    def __init__(self, lines: FileLines, rows: np.ndarray) -> None:
        self.lines, self.rows = lines, rows
        self._starts = self._ends = None

    @property
    def data(self):
        return self.lines.data

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if self._starts is None:
            starts, ends = self.lines.bounds
            self._starts, self._ends = starts[self.rows], ends[self.rows]
        return self._starts, self._ends

    @property
    def starts(self) -> np.ndarray:
        return self._bounds()[0]

    @property
    def ends(self) -> np.ndarray:
        return self._bounds()[1]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> msgspec.Raw:
        line = memoryview(self.data)[int(self.starts[k]) : int(self.ends[k])]
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
class KindColumns:
    """The records of one kind (``X``, ``B``, ``E`` or ``I``) of one file as columns, in file order.

    A field the kind does not have reads 0 (``d``, ``p``, ``i``) or has no names; ``requests`` is
    a pyarrow string array (null = none) or, from the line-by-line reader, a list of str, int
    or None; ``attrs`` a sequence of ``msgspec.Raw`` (lazy ``LineAttrs`` on the fast path)."""

    i: np.ndarray
    t: np.ndarray
    d: np.ndarray
    p: np.ndarray
    name_codes: np.ndarray  # int32 index into name_values
    name_values: list[str]
    requests: object
    errors: dict[int, str]  # row -> error
    attrs: object

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def of_records(cls, records: list) -> KindColumns:
        """Columns of decoded records (the line-by-line reader's), all of one kind."""
        n = len(records)

        def column(attr: str) -> np.ndarray:
            return np.fromiter((getattr(r, attr, 0) for r in records), np.int64, n)

        return cls(
            i=column("i"),
            t=column("t"),
            d=column("d"),
            p=column("p"),
            name_codes=np.arange(n, dtype=np.int32),
            name_values=[getattr(r, "n", "") for r in records],
            requests=[r.r for r in records],
            errors={k: r.err for k, r in enumerate(records) if getattr(r, "err", None) is not None},
            attrs=[r.a for r in records],
        )

    def take(self, rows: np.ndarray) -> KindColumns:
        """The given rows (sorted), as columns of their own."""
        new_row = {int(old): k for k, old in enumerate(rows.tolist()) if int(old) in self.errors}
        return KindColumns(
            i=self.i[rows],
            t=self.t[rows],
            d=self.d[rows],
            p=self.p[rows],
            name_codes=self.name_codes[rows],
            name_values=self.name_values,
            requests=take_values(self.requests, rows),
            errors={k: self.errors[old] for old, k in new_row.items()},
            attrs=take_values(self.attrs, rows),
        )


def take_values(values, rows: np.ndarray):
    """Items ``rows`` of a list, a pyarrow array or a ``LineAttrs``, as the same kind of sequence."""
    if isinstance(values, list):
        return [values[k] for k in rows.tolist()]
    if isinstance(values, LineAttrs):
        return LineAttrs(values.lines, values.rows[rows])
    return values.take(arrow_indices(rows))


def has_value(values) -> np.ndarray:
    """Which items of a list or pyarrow array are not None / null."""
    if isinstance(values, list):
        return np.fromiter((v is not None for v in values), bool, len(values))
    return valid_mask(values)


@dataclass
class ColumnarFile:
    """One file's records as columns, by kind: ``kinds["X"]`` the complete spans, and so on."""

    header: Header
    kinds: dict[str, KindColumns]


def read_columns(data, header: Header, body_start: int, path=None) -> ColumnarFile | None:
    """The file's records as columns, or None when the line-by-line reader must take it.
    ``data`` is the whole file, ``bytes`` or a read-only ``mmap`` (``reader.open_trace``);
    ``path`` names it in the attributes' line references (the trace cache keys on it)."""
    if not arrow():
        return None
    if body_start >= len(data) or data[-1:] != b"\n":
        return None  # empty, or a last line cut short: the reader counts it
    body = memoryview(data)[body_start:]
    try:
        table = pj.read_json(
            pa.py_buffer(body),
            read_options=pj.ReadOptions(block_size=4 << 20),
            parse_options=pj.ParseOptions(explicit_schema=_schema(), unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != _count_lines(body):
        return None  # blank lines: the reader counts them
    kind = _kind_letters(table.column("k"))
    if kind is None:
        return None  # a missing or unknown kind: the reader counts it
    fields = table.select([name for name in table.column_names if name != "k"])
    lines = FileLines(data, body_start, path)
    kinds = {k: _kind_columns(fields.slice(0, 0), LineAttrs(lines, np.zeros(0, np.int64))) for k in KINDS}
    for k in KINDS:
        rows = np.flatnonzero(kind == ord(k))
        if not len(rows):
            continue
        x = fields.take(arrow_indices(rows))
        if any(x.column(name).null_count for name in _REQUIRED[k]):
            return None  # a record without a field its kind requires
        kinds[k] = _kind_columns(x, LineAttrs(lines, rows))
    return ColumnarFile(header=header, kinds=kinds)


def _kind_letters(column) -> np.ndarray | None:
    """Each record's kind as its ASCII code, read from the string column's bytes (no hashing of a
    million one-letter strings); None when a kind is missing, longer than a letter or unknown."""
    k = column.combine_chunks()
    if k.null_count:
        return None
    if not len(k):
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(k.buffers()[1], np.int32, len(k) + 1, k.offset * 4)
    if offsets[-1] - offsets[0] != len(k):
        return None
    letters = np.frombuffer(k.buffers()[2], np.uint8, len(k), int(offsets[0]))
    known = np.zeros(256, bool)
    known[[ord(k) for k in KINDS]] = True
    return letters if known[letters].all() else None


def _count_lines(body: memoryview, step: int = 1 << 20) -> int:
    """Newlines in ``body``, a megabyte at a time (a mask of the whole file would be as large as it)."""
    u = np.frombuffer(body, np.uint8)
    return sum(int(np.count_nonzero(u[k : k + step] == 10)) for k in range(0, len(u), step))


def _line_bounds(body: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (the newline) of every line of ``body``, which ends with a newline.

    pyarrow splits the bytes in C++ (numpy's ``flatnonzero`` over a byte mask of a 100 MB file
    costs six times as long); the pieces leave out the newlines, so piece k starts k bytes early.
    Without pyarrow (a cached trace read where it has since been uninstalled), numpy does it."""
    if not arrow():
        ends = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)
        return np.r_[0, ends[:-1] + 1].astype(np.int64), ends
    import pyarrow.compute as pc

    whole = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(body)], np.int64)), pa.py_buffer(body)]
    )
    pieces = pc.split_pattern(whole, b"\n").values  # the last piece is the empty one after the final newline
    offsets = np.frombuffer(pieces.buffers()[1], np.int64, len(pieces) + 1)
    shift = np.arange(len(pieces) - 1, dtype=np.int64)
    return offsets[:-2] + shift, offsets[1:-1] + shift


def _kind_columns(x, attrs: LineAttrs) -> KindColumns:
    names = x.column("n").combine_chunks().dictionary_encode()
    err = x.column("err")
    errors = {}
    if err.null_count < len(err):
        rows = np.flatnonzero(valid_mask(err))
        errors = dict(zip(rows.tolist(), err.take(arrow_indices(rows)).to_pylist(), strict=True))
    return KindColumns(
        i=_ints(x, "i"),
        t=_ints(x, "t"),
        d=_ints(x, "d"),
        p=_ints(x, "p"),
        name_codes=to_numpy(names.indices, np.int32, -1),
        name_values=names.dictionary.to_pylist(),
        requests=x.column("r").combine_chunks(),
        errors=errors,
        attrs=attrs,
    )


_NUMPY_TYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64}


def to_numpy(array, dtype, fill: int) -> np.ndarray:
    """A pyarrow integer array (or chunked array) as a new numpy array of ``dtype``, nulls as ``fill``.

    Read from the buffers: pyarrow's own conversions (``to_numpy``, ``pa.array``, compute calls
    with a Python scalar) import pandas on first use, a fifth of a second of every open."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    if n == 0:
        return np.zeros(0, dtype)
    source = np.dtype(_NUMPY_TYPES[str(array.type)])
    values = np.frombuffer(array.buffers()[1], source, n, array.offset * source.itemsize)
    if array.null_count:
        values = np.where(valid_mask(array), values, fill)
    return values.astype(dtype)


def valid_mask(array) -> np.ndarray:
    """Which items of a pyarrow array (or chunked array) are not null, read from its validity bitmap."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n, validity = len(array), array.buffers()[0]
    if validity is None or array.null_count == 0:
        return np.ones(n, bool)
    if array.null_count == n:
        return np.zeros(n, bool)
    bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
    return bits[array.offset : array.offset + n].astype(bool)


def arrow_indices(rows: np.ndarray):
    """Row numbers as a pyarrow int64 array for ``take``, made from the numpy buffer (see ``to_numpy``)."""
    rows = np.ascontiguousarray(rows, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def _schema():
    return pa.schema(
        [
            ("k", pa.string()),
            ("i", pa.int64()),
            ("n", pa.string()),
            ("t", pa.int64()),
            ("d", pa.int64()),
            ("p", pa.int64()),
            ("r", pa.string()),
            ("err", pa.string()),
        ]
    )


def _ints(table, name: str) -> np.ndarray:
    return to_numpy(table.column(name), np.int64, 0)
