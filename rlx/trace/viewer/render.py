"""Drawing one timeline row (or the time ruler) as rich Segments. Pure functions, no Textual.

A row maps the window [t0, t1] onto ``width`` cells. When few spans are visible each is drawn
as a coloured bar with its name inside; when more spans than cells are visible (zoomed out on a
busy rollout server) the row is drawn from a coverage count per cell, vectorised, so a frame
costs the same at any zoom. The ``requests`` row shows how many requests were in flight in each
cell as a bar height (▁ to █). Events are ◆ marks; the time cursor is a reversed column.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
from rich.segment import Segment
from rich.style import Style

from rlx.trace.model import STATUS_ERROR, STATUS_UNFINISHED, Trace
from rlx.trace.safe_text import shown
from rlx.trace.units import format_ns
from rlx.trace.viewer.lanes import REQUESTS, RowData

KNOWN_COLORS = {
    "step": "grey35",
    "queued": "grey50",
    "generate": "green3",
    "rollout": "sea_green3",
    "reward": "gold3",
    "logprob": "dark_cyan",
    "update.micro_batch": "dodger_blue2",
    "optimizer_step": "medium_purple",
    "sync": "dark_orange3",
    "sync.pack": "orange3",
    "sync.transfer": "dark_orange",
    "sync.load": "orange1",
    "sync.ack": "light_salmon1",
    "checkpoint": "magenta3",
}
_PALETTE = (
    "steel_blue",
    "pale_green3",
    "khaki3",
    "plum3",
    "cadet_blue",
    "light_coral",
    "dark_sea_green",
    "sky_blue3",
    "tan",
    "orchid",
    "light_slate_blue",
    "yellow3",
)
_DARK = {
    "grey35",
    "grey50",
    "dark_cyan",
    "dodger_blue2",
    "medium_purple",
    "magenta3",
    "dark_orange3",
    "steel_blue",
    "cadet_blue",
    "light_slate_blue",
}
_LEVELS = " ▁▂▃▄▅▆▇█"
EVENT_MARK = "◆"
BLANK = Style()
CURSOR = Style(reverse=True)


def name_color(name: str) -> str:
    return KNOWN_COLORS.get(name) or _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


class Palette:
    """Styles and shown (escaped) labels per span-name index, built once per trace."""

    def __init__(self, trace: Trace) -> None:
        colors = [name_color(n) for n in trace.names]
        self.labels = [shown(n).plain for n in trace.names]
        self.bar = [Style(bgcolor=c, color="white" if c in _DARK else "black") for c in colors]
        self.event = [Style(color=c, bold=True) for c in colors]
        self.error = Style(bgcolor="red3", color="white", bold=True)
        self.selected = Style(bgcolor="white", color="black", bold=True)
        self.dense = Style(bgcolor="grey42")
        self.requests = Style(color="green3")


def _cols(times: np.ndarray, t0: float, t1: float, width: int) -> np.ndarray:
    return np.floor((times - t0) * (width / (t1 - t0))).astype(np.int64)


def _end_cols(ends: np.ndarray, starts_col: np.ndarray, t0: float, t1: float, width: int) -> np.ndarray:
    cols = np.ceil((ends - t0) * (width / (t1 - t0))).astype(np.int64) - 1
    return np.maximum(cols, starts_col)


def row_cells(
    trace: Trace, palette: Palette, kind: str, data: RowData, t0: float, t1: float, width: int, selected: int = -1
) -> tuple[list[str], list[Style]]:
    """Characters and styles of the ``width`` cells of one row."""
    chars, styles = [" "] * width, [BLANK] * width
    bars = None
    if kind == REQUESTS:
        _draw_in_flight(chars, styles, palette, data, t0, t1, width)
    else:
        pos = data.visible(t0, t1)
        if len(pos) > 2 * width:
            _draw_dense(chars, styles, trace, palette, data, pos, t0, t1, width)
        else:
            bars = _draw_bars(styles, trace, palette, data, pos, t0, t1, width, selected)
    marks = _draw_events(chars, styles, trace, palette, data, t0, t1, width)
    if bars is not None:
        _draw_labels(chars, trace, palette, *bars, marks)
    return chars, styles


def _draw_bars(styles, trace, palette, data, pos, t0, t1, width, selected) -> tuple[np.ndarray, np.ndarray]:
    """Colour each bar's cells, later starts over earlier ones (a child over its parent); returns the
    bars' span indices and, per cell, which of them shows there (-1: none)."""
    spans = trace.spans
    idx = data.spans[pos]
    cs = _cols(data.starts[pos], t0, t1, width)
    ce = _end_cols(data.ends[pos], cs, t0, t1, width)
    owner = np.full(width, -1)
    for k, (i, first, last) in enumerate(zip(idx.tolist(), cs.tolist(), ce.tolist(), strict=True)):
        a, b = max(first, 0), min(last, width - 1)
        style = palette.bar[spans.name[i]]
        if spans.status[i] == STATUS_ERROR:
            style = palette.error
        if i == selected:
            style = palette.selected
        styles[a : b + 1] = [style] * (b - a + 1)
        owner[a : b + 1] = k
    return idx, owner


def _draw_labels(chars, trace, palette, idx: np.ndarray, owner: np.ndarray, marks: np.ndarray) -> None:
    """Each bar's name in the first run of cells that still show the bar and hold the whole name, else
    in its longest run: a child bar or an event mark covers some of a bar's cells, and no label
    overwrites another label or a mark (``◆enerate``)."""
    owner = owner.copy()
    owner[marks] = -1
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    ends = np.r_[starts[1:], len(owner)] - 1
    spans, runs = trace.spans, {}
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if owner[a] >= 0:
            runs.setdefault(int(owner[a]), []).append((a, b))
    for k, bar_runs in runs.items():
        i = idx[k]
        text = palette.labels[spans.name[i]]
        a, b = next((r for r in bar_runs if r[1] - r[0] >= len(text)), max(bar_runs, key=lambda r: r[1] - r[0]))
        _label(chars, a, b, text, spans.status[i] == STATUS_UNFINISHED)


def _label(chars: list[str], a: int, b: int, name: str, unfinished: bool) -> None:
    """The name in cells a..b of its bar; cut with '…' so that neighbouring bars stay apart."""
    room = b - a + 1
    text = name + (" …" if unfinished else "")
    if len(text) >= room:
        text = text[: room - 1] + "…" if room >= 3 else ""
    chars[a : b + 1] = list(text.ljust(room))


def _draw_dense(chars, styles, trace, palette, data, pos, t0, t1, width) -> None:
    """More spans than cells: colour each covered cell by the last span starting in or before it."""
    cs = np.clip(_cols(data.starts[pos], t0, t1, width), 0, width - 1)
    ce = np.clip(_end_cols(data.ends[pos], cs, t0, t1, width), 0, width - 1)
    cover = np.cumsum(np.bincount(cs, minlength=width + 1) - np.bincount(ce + 1, minlength=width + 2)[: width + 1])
    last = np.searchsorted(cs, np.arange(width), side="right") - 1
    names = trace.spans.name[data.spans[pos]]
    for col in np.flatnonzero(cover[:width] > 0).tolist():
        k = last[col]
        styles[col] = palette.bar[names[k]] if k >= 0 and ce[k] >= col else palette.dense


def _draw_in_flight(chars, styles, palette, data, t0, t1, width) -> None:
    pos = data.visible(t0, t1)
    if not len(pos):
        return
    cs = np.clip(_cols(data.starts[pos], t0, t1, width), 0, width - 1)
    ce = np.clip(_end_cols(data.ends[pos], cs, t0, t1, width), 0, width - 1)
    count = np.cumsum(np.bincount(cs, minlength=width + 1) - np.bincount(ce + 1, minlength=width + 2)[: width + 1])[
        :width
    ]
    top = max(int(count.max()), 1)
    for col in np.flatnonzero(count).tolist():
        chars[col] = _LEVELS[max(1, math.ceil(count[col] / top * 8))]
        styles[col] = palette.requests


def _draw_events(chars, styles, trace, palette, data, t0, t1, width) -> np.ndarray:
    """Mark each event's cell; returns the marked columns."""
    pos = data.visible_events(t0, t1)
    if not len(pos):
        return np.arange(0)
    cols = np.clip(_cols(data.event_times[pos], t0, t1, width), 0, width - 1)
    names = trace.events.name[data.events[pos]]
    last = np.r_[cols[1:] != cols[:-1], True]  # by time, so the last event of each cell is the one drawn
    for col, name in zip(cols[last].tolist(), names[last].tolist(), strict=True):
        chars[col] = EVENT_MARK
        styles[col] = styles[col] + palette.event[name] if styles[col].bgcolor else palette.event[name]
    return cols


def to_segments(chars: list[str], styles: list[Style], cursor: int | None = None) -> list[Segment]:
    """Cells to segments, merging runs of one style; the cursor column is drawn reversed."""
    if cursor is not None and 0 <= cursor < len(chars):
        styles = styles.copy()
        styles[cursor] = styles[cursor] + CURSOR
        if chars[cursor] == " ":
            chars = chars.copy()
            chars[cursor] = "│"
    segments, start = [], 0
    for k in range(1, len(chars) + 1):
        if k == len(chars) or styles[k] is not styles[start]:
            segments.append(Segment("".join(chars[start:k]), styles[start]))
            start = k
    return segments


def ruler(t0: float, t1: float, width: int) -> list[str]:
    """Tick marks with times (since the trace origin) about every 14 cells."""
    chars = [" "] * width
    step = nice_step((t1 - t0) * 14 / max(width, 1))
    tick = math.ceil(t0 / step) * step
    while tick <= t1:
        col = int((tick - t0) * width / (t1 - t0))
        text = "╵" + format_ns(tick, digits=4)
        if col + len(text) <= width and chars[col] == " " and all(c == " " for c in chars[col : col + len(text) + 1]):
            chars[col : col + len(text)] = list(text)
        tick += step
    return chars


def nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= raw."""
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
