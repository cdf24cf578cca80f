"""Per-span-name statistics of a trace: count, total, mean, p50, p99, max, errors, unfinished.

Percentiles are nearest-rank over finished spans (an unfinished span has no duration yet; it
is counted in its own column). The same rows feed ``rlx trace-view --summary`` (a rich table
on stdout, for scripts and CI) and the viewer's Summary tab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlx.trace.model import STATUS_ERROR, STATUS_UNFINISHED, Trace
from rlx.trace.safe_text import shown
from rlx.trace.units import format_ns

SORT_KEYS = ("name", "count", "total", "mean", "p50", "p99", "max", "errors", "unfinished")
SUMMARY_NOTE = (
    "total adds up every span's duration: spans that overlap (requests in flight together, a span "
    "and its children) are each counted, so a total can exceed the wall time"
)


@dataclass
class SummaryRow:
    name: str
    count: int
    total: int
    mean: float
    p50: int
    p99: int
    max: int
    errors: int
    unfinished: int

    def cells(self) -> list:
        """The row as table cells: the name escaped (``safe_text.shown``), the numbers as text."""
        times = [format_ns(v) if self.count else "-" for v in (self.total, self.mean, self.p50, self.p99, self.max)]
        return [shown(self.name), str(self.count), *times, str(self.errors), str(self.unfinished)]


def summarize(trace: Trace, mask: np.ndarray | None = None, sort: str = "total") -> list[SummaryRow]:
    """One row per span name (of the spans in ``mask``), sorted by ``sort`` (largest first)."""
    spans = trace.spans
    selected = np.ones(len(spans), bool) if mask is None else mask
    finished = selected & (spans.status != STATUS_UNFINISHED)
    names, durations = spans.name[finished], spans.duration[finished]
    order = np.lexsort((durations, names))
    names, durations = names[order], durations[order]
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]]) if len(names) else np.array([], int)
    bounds = np.r_[starts, len(names)]
    rows = {
        int(names[a]): _row(trace.names[int(names[a])], durations[a:b])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    }
    errors = np.bincount(spans.name[selected & (spans.status == STATUS_ERROR)], minlength=len(trace.names))
    unfinished = np.bincount(spans.name[selected & (spans.status == STATUS_UNFINISHED)], minlength=len(trace.names))
    for k in np.flatnonzero(np.bincount(spans.name[selected], minlength=len(trace.names))):
        row = rows.setdefault(int(k), _row(trace.names[k], np.array([], np.int64)))
        row.errors, row.unfinished = int(errors[k]), int(unfinished[k])
    return sort_rows(list(rows.values()), sort)


def _row(name: str, sorted_durations: np.ndarray) -> SummaryRow:
    n = len(sorted_durations)
    if n == 0:
        return SummaryRow(name, 0, 0, 0.0, 0, 0, 0, 0, 0)
    total = int(sorted_durations.sum())
    return SummaryRow(
        name=name,
        count=n,
        total=total,
        mean=total / n,
        p50=int(_rank(sorted_durations, 0.50)),
        p99=int(_rank(sorted_durations, 0.99)),
        max=int(sorted_durations[-1]),
        errors=0,
        unfinished=0,
    )


def _rank(sorted_values: np.ndarray, q: float) -> int:
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def sort_rows(rows: list[SummaryRow], key: str, reverse: bool | None = None) -> list[SummaryRow]:
    """Rows sorted by a column of SORT_KEYS: names A-Z, numbers largest first (unless reversed)."""
    if key not in SORT_KEYS:
        raise ValueError(f"cannot sort the summary by {key!r}; use one of: {', '.join(SORT_KEYS)}")
    descending = key != "name" if reverse is None else reverse
    return sorted(rows, key=lambda r: getattr(r, key), reverse=descending)


def summary_table(rows: list[SummaryRow], title: str = ""):
    """A rich Table of the rows."""
    from rich.table import Table

    table = Table(title=title or None, title_justify="left", caption=SUMMARY_NOTE, caption_justify="left")
    for column in SORT_KEYS:
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row.cells())
    return table
