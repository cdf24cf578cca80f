"""The ``rlx trace-view`` Textual app: Timeline, Summary and Metrics tabs over one trace.

The trace is loaded before the app starts (``loader.py``), so the app only draws. A filter line
at the top narrows the timeline and the summary; the status bar at the bottom counts processes,
spans, events and skipped lines, and says how many requests were running and queued at the time
cursor. Nothing here writes files except ``save_screenshot`` (used by ``--screenshot``).
"""

from __future__ import annotations

import time

from rich.markup import escape
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Footer, Input, Static, TabbedContent, TabPane

from rlx.trace.concurrency import queued, running
from rlx.trace.metrics import Metrics
from rlx.trace.model import Trace
from rlx.trace.query import match_events, match_spans
from rlx.trace.safe_text import shown
from rlx.trace.summary import SUMMARY_NOTE, summarize
from rlx.trace.units import format_ns
from rlx.trace.viewer.details import SpanDetails
from rlx.trace.viewer.summary_view import SummaryTable
from rlx.trace.viewer.timeline import Timeline

TABS = Binding.Group("tabs")
"""The footer shows the tab keys as one entry, "1 2 3 tabs" (the tab bar's order), leaving room for the rest."""
FILTER_HELP = "filter: name, name=generate, finish_reason=length, dur>10ms, proc=rollout0 (Enter applies, Esc clears)"


class TraceViewerApp(App):
    TITLE = "rlx trace-view"
    CSS = """
    #status { height: 1; background: $panel; color: $text; padding: 0 1; }
    TabbedContent { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    #no-metrics { padding: 1 2; }
    #summary-table { height: 1fr; }
    #summary-note { height: auto; color: $text-muted; padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("slash", "focus_filter", "filter"),
        Binding("1", "show_tab('timeline')", "timeline", group=TABS),
        Binding("2", "show_tab('summary')", "summary", group=TABS),
        Binding("3", "show_tab('metrics')", "metrics", group=TABS),
    ]

    def __init__(
        self,
        trace: Trace,
        source: str,
        metrics: Metrics | None = None,
        metrics_note: str = "",
        started_at: float | None = None,
        initial_filter: str = "",
        initial_window: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.initial_filter, self.initial_window = initial_filter, initial_window
        self.trace, self.source = trace, source
        self.metrics, self.metrics_note = metrics, metrics_note
        self.started_at = time.perf_counter() if started_at is None else started_at
        self.first_frame_s: float | None = None
        self.filter_text, self.filter_note = "", ""
        self._summary_mask, self._summary_shown, self._metrics_shown = None, False, False
        self._generating, self._waiting = running(trace), queued(trace)

    def compose(self) -> ComposeResult:
        yield Input(placeholder=FILTER_HELP, id="filter", compact=True)
        with TabbedContent(initial="timeline"):
            with TabPane("Timeline", id="timeline"), Vertical():
                yield Timeline(self.trace, id="timeline-view")
                yield SpanDetails(id="details")
            with TabPane("Summary", id="summary"), Vertical():
                yield SummaryTable(id="summary-table")
                yield Static(SUMMARY_NOTE, id="summary-note")
            with TabPane("Metrics", id="metrics"):  # plots are made when the tab is first shown
                yield Vertical(id="metrics-body") if self.metrics else Static(self.metrics_note, id="no-metrics")
        yield Static(id="status")
        yield Footer()

    @property
    def timeline(self) -> Timeline:
        return self.query_one(Timeline)

    def on_mount(self) -> None:
        if self.initial_window:
            self.timeline.set_window(*self.initial_window)
            self.timeline.cursor_ns = sum(self.initial_window) / 2
        if self.initial_filter:
            self.query_one("#filter", Input).value = self.initial_filter
            self.apply_filter(self.initial_filter)
        self.timeline.focus()
        self.update_status()
        self.call_after_refresh(self._first_frame)

    def _first_frame(self) -> None:
        self.first_frame_s = time.perf_counter() - self.started_at

    # -- status ---------------------------------------------------------------------------

    def update_status(self) -> None:
        self.query_one("#status", Static).update(self.status_text())

    def status_text(self) -> str:
        trace, tl = self.trace, self.timeline
        parts = [
            f"{_markup(self.source)}: {len(trace.processes)} processes, {len(trace.spans):,} spans, "
            f"{len(trace.events):,} events"
        ]
        if trace.num_skipped:
            parts.append(f"[b red]skipped {trace.num_skipped:,} bad lines[/]")
        if self.metrics and self.metrics.skipped:
            parts.append(f"[b red]metrics: skipped {self.metrics.skipped} bad lines[/]")
        t = tl.cursor_ns
        parts.append(f"cursor {format_ns(t)}: running {self._generating.at(t)}, queued {self._waiting.at(t)}")
        if self.filter_note:
            parts.append(self.filter_note)
        return " │ ".join(parts)

    # -- filter ---------------------------------------------------------------------------

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.apply_filter(event.value)
        self.timeline.focus()

    def on_key(self, event) -> None:
        filter_box = self.query_one("#filter", Input)
        if event.key == "escape" and self.focused is filter_box:
            filter_box.value = ""
            self.apply_filter("")
            self.timeline.focus()

    def apply_filter(self, text: str) -> None:
        """Show only spans and events matching ``text`` (see rlx.trace.query); '' shows all."""
        text = text.strip()
        try:
            spans = match_spans(self.trace, text) if text else None
            events = match_events(self.trace, text) if text else None
        except ValueError as exc:
            self.filter_note = f"[b red]filter error: {_markup(exc)}[/]"
            self.update_status()
            return
        self.filter_text = text
        self.filter_note = f"filter '{_markup(text)}': {int(spans.sum()):,} spans" if text else ""
        self.timeline.apply_filter(spans, events)
        self._summary_mask, self._summary_shown = spans, False
        if self.query_one(TabbedContent).active == "summary":
            self._show_summary()
        self.update_status()

    def _show_summary(self) -> None:
        """Fill the Summary tab (first shown, or after a filter): a sort over all spans, so lazily."""
        if not self._summary_shown:
            self.query_one(SummaryTable).show(summarize(self.trace, self._summary_mask))
            self._summary_shown = True

    def _show_metrics(self) -> None:
        """Plot the metrics when their tab is first shown (textual-plotext is imported then too)."""
        if self.metrics and not self._metrics_shown:
            from rlx.trace.viewer.metrics_view import MetricsView

            self.query_one("#metrics-body").mount(MetricsView(self.metrics))
            self._metrics_shown = True

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "summary":
            self._show_summary()
        elif event.pane.id == "metrics":
            self._show_metrics()

    # -- messages from the widgets ----------------------------------------------------------

    def on_timeline_cursor_moved(self, message: Timeline.CursorMoved) -> None:
        self.update_status()

    def on_timeline_span_selected(self, message: Timeline.SpanSelected) -> None:
        self.query_one(SpanDetails).show_span(self.trace, message.span)

    def on_summary_table_name_chosen(self, message: SummaryTable.NameChosen) -> None:
        text = f"name={shown(message.name).plain}"  # the query matches names as shown, too
        self.query_one("#filter", Input).value = text
        self.apply_filter(text)
        self.action_show_tab("timeline")
        if self._summary_mask is not None:  # a window that holds none of them would show an empty timeline
            self.timeline.show_some_of(self._summary_mask)

    def action_help(self) -> None:
        from rlx.trace.viewer.help import HelpScreen

        self.push_screen(HelpScreen())

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        if tab == "timeline":
            self.timeline.focus()
        elif tab == "summary":
            self._show_summary()
            self.query_one(SummaryTable).focus()
        elif tab == "metrics":
            self._show_metrics()


def _markup(value: object) -> str:
    """A string (from the trace, or typed) inside status-bar markup: escaped, then markup-quoted."""
    return escape(shown(value).plain)
