"""The in-memory form of a loaded trace: numpy columns, one row per span and per instant event.

Columns rather than one object per span keep a million-span trace in tens of megabytes and let
the viewer, the summary and the exporter work with vectorised numpy. Times are nanoseconds since
the trace origin (the earliest process start), so every process sits on one timeline.
Attributes stay as undecoded JSON (``msgspec.Raw``) until someone asks for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlx.trace.format import NO_ATTRS, decode_attrs

STATUS_OK, STATUS_ERROR, STATUS_UNFINISHED = 0, 1, 2


@dataclass
class Process:
    """One traced process (one trace file)."""

    index: int
    name: str
    role: str
    pid: int
    host: str
    path: Path
    offset_ns: int = 0
    """Added to the file's times to get nanoseconds since the trace origin."""
    end_ns: int = 0
    """Last time seen in the file (trace-origin nanoseconds): where unfinished spans stop."""

    @property
    def label(self) -> str:
        return self.name if self.name.startswith(self.role) else f"{self.role}:{self.name}"


class AttrColumn:
    """The attributes (``msgspec.Raw``) of every span, over the files of a trace, as one sequence.

    Each segment is a list of Raw or a lazy sequence that decodes a line's attributes when asked
    (``columnar.LineAttrs``), so a million spans cost no object each until someone looks.
    """

    def __init__(self, segments=()) -> None:
        self.segments = [s for s in segments if len(s)]
        self.bases = np.cumsum([0] + [len(s) for s in self.segments])

    def __len__(self) -> int:
        return int(self.bases[-1])

    def __getitem__(self, i: int):
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"span {i} out of range ({len(self)} spans)")
        seg = int(np.searchsorted(self.bases, i, side="right")) - 1
        return self.segments[seg][i - int(self.bases[seg])]

    def __iter__(self):
        for segment in self.segments:
            yield from segment

    def candidates(self, needle: bytes, value: bytes = b"") -> list[int]:
        """Indices whose attribute text may hold ``needle`` and ``value`` (decode them to be sure)."""
        out: list[int] = []
        for segment, base in zip(self.segments, self.bases[:-1].tolist(), strict=True):
            lines = getattr(segment, "lines_containing", None)
            if lines is None:
                out += [
                    base + k
                    for k, raw in enumerate(segment)
                    if raw is not NO_ATTRS and needle in (text := bytes(raw)) and value in text
                ]
                continue
            ks = lines(needle).tolist()
            if value:
                data, starts, ends = segment.data, segment.starts, segment.ends
                ks = [k for k in ks if data.find(value, int(starts[k]), int(ends[k])) >= 0]
            out += [base + k for k in ks]
        return out


class LaterAttrs:
    """The attributes of long spans' end lines (``span.set`` after the begin line was written):
    ``attrs[k]`` (Raw) belongs to span ``owner[k]``; owners ascend, one end line per span."""

    def __init__(self, owner: np.ndarray | None = None, attrs: AttrColumn | None = None) -> None:
        self.owner = np.zeros(0, np.int64) if owner is None else owner
        self.attrs = AttrColumn() if attrs is None else attrs

    def __len__(self) -> int:
        return len(self.owner)

    def get(self, i: int):
        """The end line's attributes of span i, or None when it had no end line."""
        k = int(np.searchsorted(self.owner, i))
        return self.attrs[k] if k < len(self.owner) and self.owner[k] == i else None


@dataclass
class Spans:
    """Span columns; index i describes one span."""

    proc: np.ndarray  # int32, index into Trace.processes
    name: np.ndarray  # int32, index into Trace.names
    start: np.ndarray  # int64 ns since origin
    end: np.ndarray  # int64 ns since origin (process end for unfinished spans)
    parent: np.ndarray  # int32 span index, -1 = none (or not in the file)
    depth: np.ndarray  # int16 nesting depth, 0 = top level
    request: np.ndarray  # int32 index into Trace.request_ids (own or inherited), -1 = none
    status: np.ndarray  # int8 STATUS_*
    begin_attrs: AttrColumn  # msgspec.Raw per span (format.NO_ATTRS if none): all attributes of
    # a complete span, those given at begin for a long one
    end_attrs: LaterAttrs = field(default_factory=LaterAttrs)  # from long spans' end lines
    errors: dict = field(default_factory=dict)  # span index -> "ExcType: message"

    def attrs_set_later(self, i: int):
        return self.end_attrs.get(i)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start


@dataclass
class Events:
    """Instant-event columns."""

    proc: np.ndarray
    name: np.ndarray
    time: np.ndarray
    parent: np.ndarray
    request: np.ndarray
    attrs: AttrColumn  # msgspec.Raw per event

    def __len__(self) -> int:
        return len(self.time)


@dataclass
class Trace:
    processes: list[Process]
    names: list[str]
    request_ids: Sequence
    """Request ids (str, or int when a writer used ints) by index; ``spans.request`` points here."""
    spans: Spans
    events: Events
    origin_wall_ns: int
    skipped: Counter = field(default_factory=Counter)
    """Lines that could not be used, by reason (malformed, truncated, end without begin...)."""
    skipped_examples: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def end_ns(self) -> int:
        return max((p.end_ns for p in self.processes), default=0)

    def span_attrs(self, i: int) -> dict:
        """All attributes of span i: given at begin, set later, and its (own or inherited) request_id."""
        attrs = decode_attrs(self.spans.begin_attrs[i])
        attrs.update(decode_attrs(self.spans.attrs_set_later(i)))
        if self.spans.request[i] >= 0:
            attrs.setdefault("request_id", self.request_ids[int(self.spans.request[i])])
        return attrs

    def event_attrs(self, i: int) -> dict:
        attrs = decode_attrs(self.events.attrs[i])
        if self.events.request[i] >= 0:
            attrs.setdefault("request_id", self.request_ids[int(self.events.request[i])])
        return attrs

    def name_index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            return -1
