"""`rlx trace-view TRACE`: open a run's trace in the terminal, or summarise / export it.

Without options it starts the Textual viewer (needs a terminal). ``--summary`` prints the per
span-name table and ``--export perfetto OUT.json`` writes Chrome-trace JSON; neither starts the
TUI, so both work in scripts and CI. ``--screenshot OUT.svg`` renders the viewer headless and
saves Textual's SVG. Textual and numpy are imported inside the command, never at ``import rlx.cli``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

import typer

from rlx.cli.common import UserError, console, err_console, user_errors

EXPORT_FORMATS = ("perfetto",)


def trace_view(
    trace: str = typer.Argument(
        ..., help="Trace directory (run_dir/trace), a run directory, or one trace .jsonl file."
    ),
    metrics: str | None = typer.Option(
        None, "--metrics", help="metrics.jsonl to plot; default: the run's, next to the trace dir."
    ),
    summary: bool = typer.Option(False, "--summary", help="Print the per span-name summary table and exit (no TUI)."),
    sort: str = typer.Option(
        "total",
        "--sort",
        metavar="<name|count|total|mean|p50|p99|max|errors|unfinished>",
        help="Summary column to sort by.",
    ),
    filter_text: str = typer.Option(
        "", "--filter", help="Only spans matching this filter, e.g. 'name=generate dur>1s'."
    ),
    export: tuple[str, str] | None = typer.Option(
        None, "--export", metavar="FORMAT OUT", help="Write the trace in another format and exit: perfetto OUT.json."
    ),
    screenshot: str | None = typer.Option(
        None, "--screenshot", metavar="OUT.svg", help="Render the viewer headless and save an SVG."
    ),
    size: str = typer.Option("160x48", "--size", help="Columns x rows of --screenshot."),
    window: str = typer.Option("", "--window", help="Initial time window since trace start, e.g. 2s:5.5s."),
) -> None:
    """Show a trace: timeline, summary and metrics in the terminal; or print/export it."""
    started_at = time.perf_counter()
    with user_errors():
        if not (export or summary):
            prefetch_viewer()
        loaded = _load(trace)
        if export:
            _export(loaded, export)
        if summary:
            _print_summary(loaded, sort, filter_text)
        if export or summary:
            return
        _checked_filter(_check_only, loaded, filter_text)
        app = _make_app(loaded, trace, metrics, started_at, filter_text, _checked_window(window, loaded))
        if screenshot:
            _screenshot(app, screenshot, size)
            return
        if not sys.stdout.isatty():
            raise UserError("the viewer needs a terminal; use --summary or --export perfetto OUT.json in scripts")
    app.run()


def prefetch_viewer() -> threading.Thread:
    """Import the viewer (Textual: about half a second) in a thread while the trace loads; the
    loader's parsing runs in C without the GIL, so the two overlap. An import error surfaces later,
    where the app is made, with its install hint."""

    def run() -> None:
        with contextlib.suppress(ImportError):
            import rlx.trace.viewer  # noqa: F401

    thread = threading.Thread(target=run, name="rlx-viewer-import", daemon=True)
    thread.start()
    return thread


def _load(path: str):
    from rich.markup import escape
    from rich.text import Text

    from rlx.trace.loader import load_trace
    from rlx.trace.reader import TraceError
    from rlx.trace.safe_text import shown

    try:
        loaded = load_trace(path)
    except TraceError as exc:  # names files and values of the trace: printed escaped, as markup
        raise UserError(escape(shown(exc).plain)) from None
    if loaded.num_skipped:
        reasons = ", ".join(f"{n} {reason}" for reason, n in loaded.skipped.most_common())
        err_console.print(
            Text(f"skipped {loaded.num_skipped} unusable lines", style="yellow"),
            shown(f" ({reasons}); first: {'; '.join(loaded.skipped_examples[:3])}"),
            sep="",
            highlight=False,
        )
    return loaded


def _export(loaded, export: tuple[str, str]) -> None:
    from rlx.trace.perfetto import export_perfetto

    fmt, out = export
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"--export {fmt}: unknown format; use --export perfetto OUT.json")
    if Path(out).is_dir():
        raise UserError(
            f"--export {fmt} {out}: that is a directory; name the file to write, e.g. {Path(out) / 'trace.json'}"
        )
    blocker = next((p for p in Path(out).parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserError(f"--export {fmt} {out}: {blocker} is a file, not a directory; choose another path")
    Path(out).parent.mkdir(parents=True, exist_ok=True)  # out/trace.json works on a fresh clone
    count = export_perfetto(loaded, out)
    console.print(f"wrote {count:,} events to {out} (open it at https://ui.perfetto.dev)", highlight=False)


def _print_summary(loaded, sort: str, filter_text: str) -> None:
    from rich.console import Console

    from rlx.trace.query import match_spans
    from rlx.trace.summary import SORT_KEYS, summarize, summary_table

    if sort not in SORT_KEYS:
        raise UserError(f"--sort {sort}: use one of {', '.join(SORT_KEYS)}")
    mask = _checked_filter(match_spans, loaded, filter_text)
    rows = summarize(loaded, mask, sort=sort)
    title = f"{len(loaded.spans):,} spans, {len(loaded.events):,} events, {len(loaded.processes)} processes"
    out = console if console.is_terminal else Console(width=200)
    out.print(summary_table(rows, title=title))


def _checked_filter(match, loaded, text: str):
    if not text:
        return None
    try:
        return match(loaded, text)
    except ValueError as exc:
        raise UserError(f"--filter: {exc}") from None


def _check_only(loaded, text: str) -> None:
    from rlx.trace.query import check_keys, parse_query

    check_keys(loaded, parse_query(text))


def _checked_window(text: str, loaded) -> tuple[int, int] | None:
    """--window as nanoseconds since the trace's start; one that starts after the trace ends is refused (it
    would draw an empty timeline)."""
    from rlx.trace.units import format_ns

    window = _parse_window(text)
    if window is not None and window[0] >= loaded.end_ns:
        raise UserError(
            f"--window {text!r} starts after the trace ends ({format_ns(loaded.end_ns)} after its start); "
            f"choose a window within 0s:{format_ns(loaded.end_ns)}"
        )
    return window


def _make_app(
    loaded, trace: str, metrics_path: str | None, started_at: float, filter_text: str, window: tuple[int, int] | None
):
    try:
        from rlx.trace.viewer import TraceViewerApp
    except ImportError as exc:
        raise UserError(
            f"the viewer needs textual and textual-plotext ({exc}); install them with: pip install 'rlx[viewer]'"
        ) from None
    from rich.markup import escape

    from rlx.trace.metrics import find_metrics_file, load_metrics
    from rlx.trace.safe_text import shown

    path = Path(metrics_path) if metrics_path else find_metrics_file(trace)
    try:
        metrics = load_metrics(path) if path else None
    except ValueError as exc:
        raise UserError(escape(shown(exc).plain)) from None
    note = (
        ""
        if metrics
        else escape(
            f"No metrics file found next to {shown(trace).plain} (looked for metrics.jsonl "
            f"beside the trace directory); pass --metrics PATH."
        )
    )
    app = TraceViewerApp(
        loaded,
        trace,
        metrics=metrics,
        metrics_note=note,
        started_at=started_at,
        initial_filter=filter_text,
        initial_window=window,
    )
    return app


def _parse_window(text: str) -> tuple[int, int] | None:
    from rlx.trace.units import parse_duration_ns

    if not text:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        window = parse_duration_ns(start), parse_duration_ns(end)
    except ValueError:
        raise UserError(f"--window {text!r}: write START:END since trace start, e.g. 2s:5.5s") from None
    if window[1] <= window[0]:
        raise UserError(f"--window {text!r}: END must be after START")
    return window


def _screenshot(app, out: str, size: str) -> None:
    from rlx.trace.viewer import save_screenshot

    try:
        columns, rows = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise UserError(f"--size {size!r}: write COLUMNSxROWS, e.g. 160x48") from None
    if not (1 <= columns <= 1000 and 1 <= rows <= 1000):
        raise UserError(f"--size {size!r}: columns and rows must be in [1, 1000], e.g. 160x48")
    path = save_screenshot(app, out, (columns, rows))
    console.print(f"saved {path} ({columns}x{rows}); first frame after {app.first_frame_s:.2f}s", highlight=False)
