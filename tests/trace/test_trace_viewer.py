"""The Textual viewer driven by a pilot: open, zoom, pan, filter, select, expand, sort, plots."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from rich.text import Text
from textual.widgets import DataTable

from rlx.trace.loader import find_trace_files, load_trace
from rlx.trace.metrics import load_metrics
from rlx.trace.tracer import Tracer
from rlx.trace.viewer import TraceViewerApp
from rlx.trace.viewer.details import SpanDetails
from rlx.trace.viewer.lanes import REQUEST, REQUESTS, SPANS
from rlx.trace.viewer.metrics_view import MetricPlot
from rlx.trace.viewer.timeline import LABEL_WIDTH

SIZE = (140, 40)
pytestmark = pytest.mark.asyncio


def make_app(path, **kwargs) -> TraceViewerApp:
    return TraceViewerApp(load_trace(path), str(path), **kwargs)


def status(app) -> str:
    return str(app.query_one("#status").content)


def details(app) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.query_one(SpanDetails).content)
    return console.export_text()


def row_of(timeline, kind, proc_name, depth=0):
    procs = [p.name for p in timeline.trace.processes]
    return next(
        k
        for k, r in enumerate(timeline.lanes.rows)
        if r.kind == kind and procs[r.proc] == proc_name and (kind != SPANS or r.depth == depth)
    )


async def click_span(pilot, timeline, span: int) -> None:
    """Click the middle of a span's bar on the row that shows it."""
    spans = timeline.trace.spans
    row = next(k for k, key in enumerate(timeline.lanes.rows) if span in timeline.lanes.data(key).spans)
    x = LABEL_WIDTH + timeline.column_of((spans.start[span] + spans.end[span]) / 2)
    await pilot.click(timeline, offset=(x, row - timeline.top + 1))
    await pilot.pause()


async def test_opens_a_small_trace_with_lanes_and_status(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl = app.timeline
        labels = [tl.lanes.label(r) for r in tl.lanes.rows]
        assert labels[0] == "rollout0" and "trainer0" in labels  # rollout servers first, then trainers
        assert any(r.kind == REQUESTS for r in tl.lanes.rows)
        assert "2 processes" in status(app) and f"{len(app.trace.spans):,} spans" in status(app)
        assert "skipped" not in status(app)
        assert app.first_frame_s is not None and app.first_frame_s > 0


async def test_zoom_and_pan_with_keys_and_mouse(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl = app.timeline
        full = tl.t1 - tl.t0
        await pilot.press("w")
        assert tl.t1 - tl.t0 == pytest.approx(full / 2)
        await pilot.press("w", "w")
        assert tl.t1 - tl.t0 == pytest.approx(full / 8)
        t0 = tl.t0
        await pilot.press("d")
        assert tl.t0 == pytest.approx(t0 + full / 8 * 0.25)
        await pilot.press("shift+left")
        assert tl.t0 == pytest.approx(t0)
        await pilot.press("0")
        assert tl.t1 - tl.t0 == pytest.approx(full)
        anchor = tl.time_at(LABEL_WIDTH + 30)
        tl.on_mouse_scroll_up(_Wheel(LABEL_WIDTH + 30))  # the wheel zooms around the pointer
        assert tl.t1 - tl.t0 == pytest.approx(full * 0.8)
        assert tl.time_at(LABEL_WIDTH + 30) == pytest.approx(anchor, rel=1e-6)


class _Wheel:
    """A wheel event as Textual delivers it (pilot has no wheel helper)."""

    def __init__(self, x: int, shift: bool = False) -> None:
        self.x, self.y, self.shift = x, 3, shift

    def stop(self) -> None:
        pass


async def test_dragging_pans_the_window(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl = app.timeline
        t0, width = tl.t0, tl.t1 - tl.t0
        await pilot.mouse_down(tl, offset=(LABEL_WIDTH + 40, 2))
        await pilot.hover(tl, offset=(LABEL_WIDTH + 20, 2))
        await pilot.mouse_up(tl, offset=(LABEL_WIDTH + 20, 2))
        assert tl.t0 == pytest.approx(t0 + 20 * width / tl.plot_width)


async def test_click_selects_a_span_and_shows_its_attributes(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl, trace = app.timeline, app.trace
        step = trace.names.index("step")
        first_step = int(np.flatnonzero(trace.spans.name == step)[0])
        await click_span(pilot, tl, first_step)
        assert tl.selected == first_step
        text = details(app)
        assert "step" in text and "duration" in text and "trainer0" in text


async def test_keyboard_selects_the_span_under_the_cursor(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl, spans = app.timeline, app.trace.spans
        update = int(np.flatnonzero(spans.name == app.trace.names.index("update.micro_batch"))[0])
        tl.set_window(spans.start[update] - 1000, spans.end[update] + 1000)
        tl.set_row(row_of(tl, SPANS, "trainer0", depth=1))
        tl.set_cursor((spans.start[update] + spans.end[update]) / 2)
        await pilot.press("enter")
        assert tl.selected == update
        assert "micro_batch" in details(app) and "parent" in details(app)
        await pilot.press("f")  # zoom to the selected span
        assert tl.t0 < spans.start[update] < spans.end[update] < tl.t1


async def test_filter_by_name_and_attribute_then_clear(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("slash", *"finish_reason=length", "enter")
        await pilot.pause()
        tl = app.timeline
        assert "filter 'finish_reason=length': 2 spans" in status(app)
        assert int(tl.lanes.span_mask.sum()) == 2
        rollout_requests = tl.lanes.rows[row_of(tl, REQUESTS, "rollout0")]
        assert len(tl.lanes.requests_of(rollout_requests.proc)) == 2  # only the two matching requests
        await pilot.press("2")  # the summary follows the filter
        table = app.query_one(DataTable)
        assert table.row_count == 1 and str(table.get_row_at(0)[0]) == "generate"
        await pilot.press("1", "slash", "escape")
        assert int(tl.lanes.span_mask.sum()) == len(app.trace.spans)
        await pilot.press("slash", *"dur=1", "enter")
        assert "filter error" in status(app)


async def test_requests_expand_into_one_row_each(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl = app.timeline
        before = len(tl.lanes.rows)
        tl.set_row(row_of(tl, REQUESTS, "rollout0"))
        await pilot.press("space")
        request_rows = [r for r in tl.lanes.rows if r.kind == REQUEST]
        assert len(tl.lanes.rows) == before + 12 == before + len(request_rows)
        names = [app.trace.names[app.trace.spans.name[i]] for i in tl.lanes.data(request_rows[0]).spans]
        assert names == ["queued", "generate"]
        assert len(tl.lanes.data(request_rows[0]).events) == 1
        await pilot.press("space")
        assert len(tl.lanes.rows) == before


async def test_cursor_counts_running_and_queued_requests(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        spans = app.trace.spans
        gen = np.flatnonzero(spans.name == app.trace.names.index("generate"))
        t = spans.start[gen[0]] + 1
        expected = int(((spans.start[gen] <= t) & (spans.end[gen] > t)).sum())
        app.timeline.set_cursor(t)
        await pilot.pause()
        assert f"running {expected}," in status(app)
        assert expected >= 1


async def test_truncated_trace_opens_with_the_skipped_count(small_trace):
    path = [p for p in find_trace_files(small_trace) if p.name.startswith("rollout0")][0]
    path.write_bytes(path.read_bytes() + b'{"k":"E","i":3,"t"')
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "skipped 1 bad lines" in status(app)
        assert len(app.trace.spans) > 0


async def test_summary_sorts_by_clicked_column(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one(DataTable)
        totals = [r.total for r in table.rows_data]
        assert totals == sorted(totals, reverse=True)
        x = 0
        for column in table.columns.values():  # click the middle of the "count" header
            if column.key.value == "count":
                break
            x += column.get_render_width(table)
        await pilot.click(table, offset=(x + 2, 0))
        await pilot.pause()
        counts = [int(table.get_row_at(k)[1]) for k in range(table.row_count)]
        assert counts == sorted(counts, reverse=True) and table.sort_key == "count"
        await pilot.press("s")  # next column
        assert table.sort_key == "total"


async def test_metrics_tab_plots_the_run_metrics(small_trace):
    metrics_path = small_trace.parent / "metrics.jsonl"
    metrics_path.write_text(
        "".join(
            f'{{"step": {s}, "reward_mean": {s / 10}, "accuracy": {s / 20}, "kl": 0.001, '
            f'"response_len_mean": 4, "tokens_per_s": 1500}}\n'
            for s in range(5)
        )
        + "oops\n"
    )
    app = make_app(small_trace, metrics=load_metrics(metrics_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        plots = list(app.query(MetricPlot))
        assert [p.title for p in plots][:2] == ["reward", "accuracy"] and len(plots) == 6
        assert "metrics: skipped 1 bad lines" in status(app)


async def test_metrics_tab_without_a_file_says_how_to_add_one(small_trace):
    app = make_app(small_trace, metrics_note="No metrics file found; pass --metrics PATH.")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        assert "--metrics" in str(app.query_one("#no-metrics").content)


async def test_expanded_requests_follow_the_time_window(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl, spans = app.timeline, app.trace.spans
        tl.set_row(row_of(tl, REQUESTS, "rollout0"))
        await pilot.press("space")
        assert len([r for r in tl.lanes.rows if r.kind == REQUEST]) == 12
        rollouts = np.flatnonzero(spans.name == app.trace.names.index("rollout"))
        tl.set_window(spans.start[rollouts[1]], spans.end[rollouts[1]])  # zoom onto step 1's rollout
        rows = [r for r in tl.lanes.rows if r.kind == REQUEST]
        assert sorted(app.trace.request_ids[r.request] for r in rows) == [f"req-1-{i}" for i in range(6)]
        assert "requests 6/12 in view" in tl.lanes.label(tl.lanes.rows[row_of(tl, REQUESTS, "rollout0")])


async def test_question_mark_lists_every_key(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        from rlx.trace.viewer.help import HELP, HelpScreen

        assert isinstance(app.screen, HelpScreen)
        help_box = app.screen.query_one("#help")
        text = str(help_box.content)
        assert "zoom to it" in text and "total can exceed the wall time" in text and "status=error" in text
        lines = Text.from_markup(HELP).plain.splitlines()  # laid out at its text's size, not 0x0 in a box
        assert help_box.content_region.width >= max(map(len, lines)) and help_box.content_region.height == len(lines)
        await pilot.press("x")  # any key closes it
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_enter_on_a_summary_row_moves_a_window_that_shows_none_of_them(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl, spans = app.timeline, app.trace.spans
        checkpoints = np.flatnonzero(spans.name == app.trace.names.index("checkpoint"))
        first_generate = spans.start[np.flatnonzero(spans.name == app.trace.names.index("generate"))].min()
        tl.set_window(first_generate, first_generate + 1e6)  # 1 ms among the requests: no checkpoint there
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one(DataTable)
        table.move_cursor(row=[r.name for r in table.rows_data].index("checkpoint"))
        await pilot.press("enter")
        await pilot.pause()
        assert app.query_one("TabbedContent").active == "timeline"
        shown_now = (spans.start[checkpoints] < tl.t1) & (spans.end[checkpoints] > tl.t0)
        assert shown_now.all() and tl.t0 <= spans.start[checkpoints].min() <= tl.cursor_ns <= tl.t1


async def test_the_summary_tab_says_totals_add_up_overlapping_spans(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        assert "total can exceed the wall time" in str(app.query_one("#summary-note").content)


async def test_the_footer_lists_the_tab_keys(small_trace):
    app = make_app(small_trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        footer = app.query_one("Footer")
        keys = [key.key for key in footer.query("FooterKey")]
        assert {"1", "2", "3"} <= set(keys) and "tabs" in [str(label.render()) for label in footer.query("FooterLabel")]
        await pilot.press("2")
        assert app.query_one("TabbedContent").active == "summary"


async def test_bar_labels_leave_event_marks_and_child_bars_whole(tmp_path):
    """A request's ``queued`` event at the start of its ``generate`` bar and a child bar in the middle
    of it: each label sits in cells of its own bar (``◆enerate`` was the mark over the 'g')."""
    trace_dir = tmp_path / "trace"
    tracer = Tracer()
    tracer.configure(trace_dir, role="rollout", name="rollout0")
    tracer.event("queued", request_id="r0")
    with tracer.span("generate", request_id="r0"):
        time.sleep(0.02)
        with tracer.span("sample", request_id="r0"):
            time.sleep(0.01)
        time.sleep(0.02)
    tracer.close()
    app = make_app(trace_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tl, spans = app.timeline, app.trace.spans
        tl.set_row(row_of(tl, REQUESTS, "rollout0"))
        await pilot.press("space")
        generate = int(np.flatnonzero(spans.name == app.trace.names.index("generate"))[0])
        tl.set_window(spans.start[generate] - 100_000, spans.end[generate])  # the event and the start in cell 0
        tl.set_cursor(tl.t1 + 1)  # off the row, so it marks no cell
        await pilot.pause()
        row = next(k for k, key in enumerate(tl.lanes.rows) if key.kind == REQUEST)
        cells = tl.render_line(row - tl.top + 1).text[LABEL_WIDTH:]
        assert cells.startswith("◆generate") and "sample" in cells, cells


async def test_metric_axes_read_round_numbers(small_trace):
    """A k3 of float noise (1e-9) labels its ticks 1e-09, 0, -1e-09, not -0.0000000018."""
    metrics_path = small_trace.parent / "metrics.jsonl"
    k3 = [1.8e-9, -1.8e-9, 0.0, 2e-10, -5e-10]
    metrics_path.write_text(
        "".join(f'{{"step": {s}, "logprob_k3": {v}, "entropy": {2.3456 + s / 1000}}}\n' for s, v in enumerate(k3))
    )
    app = make_app(small_trace, metrics=load_metrics(metrics_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        plots = {p.title.split(" ")[0]: p.render().plain for p in app.query(MetricPlot)}
        ticks = [line.split("┤")[0].strip() for line in plots["KL"].splitlines() if "┤" in line]
        assert ticks == ["1e-09", "0", "-1e-09"], ticks
        ticks = [line.split("┤")[0].strip() for line in plots["entropy"].splitlines() if "┤" in line]
        assert ticks == ["2.349", "2.348", "2.347", "2.346"], ticks
