"""The timeline widget: lanes of span bars under a time ruler, with a cursor, zoom and pan.

Keys: ←/→ move the time cursor, shift+←/→ (or a/d) pan, +/- (or w/s) zoom around the cursor,
0 fits the whole trace, ↑/↓ pick a row, enter selects the span under the cursor, space expands a
process's requests, f zooms to the selected span. Mouse: the wheel zooms around the pointer
(shift+wheel pans; over the labels it scrolls the rows), dragging pans, a click moves the
cursor there and selects the span under it.

The widget draws with Textual's Line API (``render_line``): only visible rows are computed,
each with a couple of binary searches and a vectorised fill (see ``render.py``).
"""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import (
    Click,
    MouseDown,
    MouseMove,
    MouseScrollDown,
    MouseScrollLeft,
    MouseScrollRight,
    MouseScrollUp,
    MouseUp,
)
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from rlx.trace.model import Trace
from rlx.trace.safe_text import shown
from rlx.trace.units import format_ns
from rlx.trace.viewer.lanes import REQUEST, REQUESTS, Lanes, RowKey
from rlx.trace.viewer.render import Palette, row_cells, ruler, to_segments

LABEL_WIDTH = 24
MIN_WINDOW_NS = 1_000
_MAX_MEMO_ROWS = 512
_ROLE_STYLE = {
    "rollout": Style(color="green3", bold=True),
    "trainer": Style(color="dodger_blue1", bold=True),
    "sync": Style(color="dark_orange", bold=True),
    "launcher": Style(color="magenta", bold=True),
}
_LABEL = Style(color="grey70")
_CURRENT = Style(reverse=True)
_RULER = Style(color="grey62")


class Timeline(Widget, can_focus=True):
    """One row per process depth / request; spans as bars, events as marks."""

    DEFAULT_CSS = "Timeline { height: 1fr; }"

    BINDINGS = [
        Binding("left,h", "move_cursor(-1)", "cursor", show=False),
        Binding("right,l", "move_cursor(1)", "cursor", show=False),
        Binding("shift+left,a", "pan(-0.25)", "pan", key_display="a/d"),
        Binding("shift+right,d", "pan(0.25)", "pan", show=False),
        Binding("plus,equals_sign,w", "zoom(0.5)", "zoom", key_display="w/s"),
        Binding("minus,s", "zoom(2)", "zoom out", show=False),
        Binding("0,home", "fit", "fit"),
        Binding("up,k", "move_row(-1)", "row", show=False),
        Binding("down,j", "move_row(1)", "row", show=False),
        Binding("pageup", "move_row(-10)", show=False),
        Binding("pagedown", "move_row(10)", show=False),
        Binding("enter", "select_here", "select"),
        Binding("space", "toggle_requests", "requests"),
        Binding("f", "focus_selected", "zoom to span"),
    ]

    class SpanSelected(Message):
        def __init__(self, span: int) -> None:
            self.span = span
            super().__init__()

    class CursorMoved(Message):
        def __init__(self, time_ns: float) -> None:
            self.time_ns = time_ns
            super().__init__()

    def __init__(self, trace: Trace, **kwargs) -> None:
        super().__init__(**kwargs)
        self.trace = trace
        self.palette = Palette(trace)
        self.lanes = Lanes(trace)
        self.t0, self.t1 = self._extent()
        self.lanes.set_window(self.t0, self.t1)
        self.cursor_ns = (self.t0 + self.t1) / 2
        self.row = 0
        self.top = 0
        self.selected = -1
        self._cells: dict[tuple, tuple[list, list]] = {}
        self._drag: tuple[int, float, float] | None = None
        self._dragged = False

    # -- geometry -------------------------------------------------------------------------

    def _extent(self) -> tuple[float, float]:
        end = max(self.trace.end_ns, MIN_WINDOW_NS)
        return -end * 0.01, end * 1.01

    @property
    def plot_width(self) -> int:
        return max(self.size.width - LABEL_WIDTH, 1)

    @property
    def visible_rows(self) -> int:
        return max(self.size.height - 1, 1)

    def time_at(self, x: int) -> float:
        return self.t0 + (x - LABEL_WIDTH + 0.5) * (self.t1 - self.t0) / self.plot_width

    def column_of(self, t: float) -> int:
        return int(np.floor((t - self.t0) * self.plot_width / (self.t1 - self.t0)))

    # -- drawing --------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._ruler_line(width)
        k = self.top + y - 1
        if k >= len(self.lanes.rows):
            return Strip.blank(width)
        key = self.lanes.rows[k]
        chars, styles = self._row_cells(key)
        segments = [self._label_segment(key, k == self.row)]
        segments += to_segments(chars, styles, self.column_of(self.cursor_ns))
        return Strip(segments, width)

    def _row_cells(self, key: RowKey) -> tuple[list, list]:
        """A row's cells, kept while the window, width and selection stay: Textual draws a line
        more than once (the first frame draws every row twice), the cursor is added on top."""
        memo_key = (key, self.t0, self.t1, self.plot_width, self.selected)
        cells = self._cells.get(memo_key)
        if cells is None:
            if len(self._cells) >= _MAX_MEMO_ROWS:
                self._cells.clear()
            cells = self._cells[memo_key] = row_cells(
                self.trace,
                self.palette,
                key.kind,
                self.lanes.data(key),
                self.t0,
                self.t1,
                self.plot_width,
                self.selected,
            )
        return cells

    def _ruler_line(self, width: int) -> Strip:
        head = f" window {format_ns(self.t1 - self.t0)}".ljust(LABEL_WIDTH)[:LABEL_WIDTH]
        ticks = "".join(ruler(self.t0, self.t1, self.plot_width))
        return Strip([Segment(head, _RULER), Segment(ticks, _RULER)], width)

    def _label_segment(self, key: RowKey, current: bool) -> Segment:
        text = shown(self.lanes.label(key)).plain
        text = (text[: LABEL_WIDTH - 2] + "… ") if len(text) > LABEL_WIDTH - 1 else text.ljust(LABEL_WIDTH)
        style = _LABEL
        if key.kind not in (REQUEST, REQUESTS) and not text.startswith(" "):
            style = _ROLE_STYLE.get(self.trace.processes[key.proc].role, _LABEL)
        return Segment(text, style + _CURRENT if current else style)

    # -- actions --------------------------------------------------------------------------

    def set_window(self, t0: float, t1: float) -> None:
        lo, hi = self._extent()
        width = min(max(t1 - t0, MIN_WINDOW_NS), (hi - lo) * 2)
        center = (t0 + t1) / 2
        self._view(center - width / 2, center + width / 2)

    def action_zoom(self, factor: float, anchor: float | None = None) -> None:
        """Scale the window by ``factor`` (< 1 zooms in) keeping ``anchor`` (or the cursor) in place."""
        a = self.cursor_ns if anchor is None else anchor
        if not self.t0 <= a <= self.t1:
            a = (self.t0 + self.t1) / 2
        t0, t1 = a - (a - self.t0) * factor, a + (self.t1 - a) * factor
        lo, hi = self._extent()
        if t1 - t0 < MIN_WINDOW_NS:
            return
        if t1 - t0 > (hi - lo) * 2:
            t0, t1 = lo, hi
        self._view(t0, t1)

    def action_pan(self, fraction: float) -> None:
        shift = (self.t1 - self.t0) * fraction
        self._view(self.t0 + shift, self.t1 + shift)

    def action_fit(self) -> None:
        self._view(*self._extent())

    def _view(self, t0: float, t1: float) -> None:
        """Show [t0, t1]; expanded request rows follow the window (the requests in flight in it)."""
        self.t0, self.t1 = t0, t1
        key = self.lanes.rows[self.row] if self.lanes.rows else None
        if self.lanes.set_window(t0, t1) and key is not None:
            rows = self.lanes.rows
            self.set_row(
                rows.index(key) if key in rows else rows.index(RowKey(REQUESTS, key.proc)) if key.kind == REQUEST else 0
            )
        self.refresh()

    def action_move_cursor(self, columns: int) -> None:
        step = (self.t1 - self.t0) / self.plot_width
        self.set_cursor(self.cursor_ns + columns * step)
        if not self.t0 <= self.cursor_ns <= self.t1:
            self.action_pan(columns / abs(columns) * 0.25)

    def set_cursor(self, t: float) -> None:
        self.cursor_ns = t
        self.post_message(self.CursorMoved(t))
        self.refresh()

    def action_move_row(self, delta: int) -> None:
        self.set_row(self.row + delta)

    def set_row(self, row: int) -> None:
        self.row = min(max(row, 0), max(len(self.lanes.rows) - 1, 0))
        if self.row < self.top:
            self.top = self.row
        elif self.row >= self.top + self.visible_rows:
            self.top = self.row - self.visible_rows + 1
        self.refresh()

    def action_select_here(self) -> None:
        self.select(self.span_at(self.row, self.cursor_ns))

    def select(self, span: int) -> None:
        self.selected = span
        self.post_message(self.SpanSelected(span))
        self.refresh()

    def action_toggle_requests(self) -> None:
        if not self.lanes.rows:
            return
        key = self.lanes.rows[self.row]
        self.lanes.toggle(key.proc)
        rows = self.lanes.rows
        self.set_row(rows.index(key) if key in rows else rows.index(RowKey(REQUESTS, key.proc)))

    def action_focus_selected(self) -> None:
        if self.selected < 0:
            return
        start, end = self.trace.spans.start[self.selected], self.trace.spans.end[self.selected]
        margin = max((end - start) * 0.1, MIN_WINDOW_NS)
        self.set_window(start - margin, end + margin)
        self.set_cursor((start + end) / 2)

    def show_some_of(self, span_mask: np.ndarray) -> None:
        """When the window holds none of the spans in ``span_mask``, move it to their extent (cursor on the first);
        a window that holds some stays as it is."""
        spans = self.trace.spans
        chosen = np.flatnonzero(span_mask)
        if not len(chosen) or np.any((spans.start[chosen] < self.t1) & (spans.end[chosen] > self.t0)):
            return
        start, end = float(spans.start[chosen].min()), float(spans.end[chosen].max())
        margin = max((end - start) * 0.05, MIN_WINDOW_NS)
        self.set_window(start - margin, end + margin)
        self.set_cursor(float(spans.start[chosen[np.argmin(spans.start[chosen])]]))

    def apply_filter(self, span_mask: np.ndarray | None, event_mask: np.ndarray | None) -> None:
        expanded = self.lanes.expanded
        self.lanes = Lanes(self.trace, span_mask, event_mask)
        self._cells.clear()
        self.lanes.set_window(self.t0, self.t1)
        for proc in expanded:
            self.lanes.toggle(proc)
        self.top = 0
        self.set_row(0)

    # -- picking --------------------------------------------------------------------------

    def span_at(self, row: int, t: float) -> int:
        """The innermost span on a row at time t (within one cell), or -1."""
        if not 0 <= row < len(self.lanes.rows) or self.lanes.rows[row].kind == REQUESTS:
            return -1
        data = self.lanes.data(self.lanes.rows[row])
        tolerance = (self.t1 - self.t0) / self.plot_width
        pos = data.visible(t - tolerance, t + tolerance)
        if not len(pos):
            return -1
        starts, ends = data.starts[pos], data.ends[pos]
        gap = np.maximum(starts - t, 0) + np.maximum(t - ends, 0)
        best = np.lexsort((ends - starts, gap))[0]
        return int(data.spans[pos[best]])

    # -- mouse ----------------------------------------------------------------------------

    def on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self._wheel(event, -1)

    def on_mouse_scroll_down(self, event: MouseScrollDown) -> None:
        self._wheel(event, 1)

    def on_mouse_scroll_left(self, event: MouseScrollLeft) -> None:
        event.stop()
        self.action_pan(-0.1)

    def on_mouse_scroll_right(self, event: MouseScrollRight) -> None:
        event.stop()
        self.action_pan(0.1)

    def _wheel(self, event, direction: int) -> None:
        event.stop()
        if event.x < LABEL_WIDTH:
            self.top = min(max(self.top + 3 * direction, 0), max(len(self.lanes.rows) - 1, 0))
            self.refresh()
        elif event.shift:
            self.action_pan(0.1 * direction)
        else:
            self.action_zoom(1.25 if direction > 0 else 0.8, anchor=self.time_at(event.x))

    def on_mouse_down(self, event: MouseDown) -> None:
        if event.x >= LABEL_WIDTH:
            self._drag, self._dragged = (event.x, self.t0, self.t1), False
            self.capture_mouse()

    def on_mouse_move(self, event: MouseMove) -> None:
        if self._drag is None:
            return
        x0, t0, t1 = self._drag
        if event.x != x0:
            shift = (x0 - event.x) * (t1 - t0) / self.plot_width
            self._dragged = True
            self._view(t0 + shift, t1 + shift)

    def on_mouse_up(self, event: MouseUp) -> None:
        if self._drag is not None:
            self._drag = None
            self.release_mouse()

    def on_click(self, event: Click) -> None:
        if self._dragged:
            self._dragged = False
            return
        if event.y == 0:
            return
        row = self.top + event.y - 1
        if row >= len(self.lanes.rows):
            return
        self.set_row(row)
        if self.lanes.rows[row].kind == REQUESTS or event.x < LABEL_WIDTH:
            if self.lanes.rows[row].kind == REQUESTS:
                self.action_toggle_requests()
            return
        self.set_cursor(self.time_at(event.x))
        self.select(self.span_at(row, self.cursor_ns))
