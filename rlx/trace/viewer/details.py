"""The panel under the timeline that describes the selected span: name, process, times,
duration, parent, request, status and every attribute. Every string from the trace is drawn
through ``safe_text.shown`` (escaped, never markup)."""

from __future__ import annotations

import datetime

from rich.table import Table
from textual.widgets import Static

from rlx.trace.model import STATUS_ERROR, STATUS_UNFINISHED, Trace
from rlx.trace.safe_text import shown
from rlx.trace.units import format_ns

_HINT = "Click a span, or move the cursor (←/→, ↑/↓) and press Enter, to see its attributes here."


def wall_time(trace: Trace, t_ns: float) -> str:
    moment = datetime.datetime.fromtimestamp((trace.origin_wall_ns + t_ns) / 1e9)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def describe_span(trace: Trace, i: int) -> Table:
    """A two-column table of everything known about span i."""
    spans = trace.spans
    p = trace.processes[int(spans.proc[i])]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold grey70", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("span", shown(trace.names[int(spans.name[i])], style="bold"))
    table.add_row("process", shown(f"{p.label} (role {p.role}, pid {p.pid}, {p.host})"))
    table.add_row(
        "start", f"{format_ns(int(spans.start[i]), 6)} after trace start ({wall_time(trace, int(spans.start[i]))})"
    )
    duration = format_ns(int(spans.duration[i]), 4)
    status = int(spans.status[i])
    if status == STATUS_UNFINISHED:
        duration += "  (unfinished: no end was written; shown up to the last line of its process)"
    table.add_row("duration", duration)
    if status == STATUS_ERROR:
        table.add_row("error", shown(spans.errors.get(i, ""), style="bold red"))
    parent = int(spans.parent[i])
    if parent >= 0:
        table.add_row(
            "parent", shown(f"{trace.names[int(spans.name[parent])]} ({format_ns(int(spans.duration[parent]))})")
        )
    for key, value in trace.span_attrs(i).items():
        table.add_row(shown(key), shown(value))
    return table


class SpanDetails(Static):
    DEFAULT_CSS = "SpanDetails { height: 9; border-top: solid $primary; padding: 0 1; overflow-y: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(_HINT, **kwargs)

    def show_span(self, trace: Trace, i: int) -> None:
        self.update(describe_span(trace, i) if i >= 0 else "No span there. " + _HINT)
