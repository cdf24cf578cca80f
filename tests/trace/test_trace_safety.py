"""A trace from anyone is safe to read: its strings cannot drive the terminal, its size cannot
exhaust memory, and what is not a trace is refused in one line."""

from __future__ import annotations

import html
import json
import time

import pytest
from typer.testing import CliRunner

from rlx.cli import app as cli
from rlx.trace.loader import load_trace
from rlx.trace.tracer import Tracer
from rlx.trace.viewer import TraceViewerApp
from rlx.trace.viewer.timeline import Timeline

runner = CliRunner()
LINK = "[link=https://evil.example/]x[/link]"
NAME = "\x1b[2J[bold]step\u202e" + LINK  # clears the screen, bold markup, bidi override, a link
PROC = "rollout\x1b]0;PWNED\x07[i]0"  # retitles the terminal
REQUEST = "req\x9b5m[blink]"  # C1 CSI: blink
KEY, VALUE = "key\x1b[8m", "value\u2066[red]\x00" + LINK
ERROR = "boom\r\x1b[1A[bold red]fine"
RAW = ("\x1b", "\x9b", "\x07", "\x00", "\r", "\u202e", "\u2066")


@pytest.fixture
def hostile_trace(tmp_path):
    trace_dir = tmp_path / "trace"
    trainer, rollout = Tracer(), Tracer()
    trainer.configure(trace_dir, role="trainer", name="trainer0")
    rollout.configure(trace_dir, role="rollout\u202e", name=PROC)
    with trainer.span(NAME, **{KEY: VALUE}):
        with rollout.span("generate", request_id=REQUEST, **{KEY: VALUE}):
            rollout.event(NAME, **{KEY: VALUE})
            time.sleep(0.02)
        with pytest.raises(ValueError), trainer.span("checkpoint"):
            raise ValueError(ERROR)
        time.sleep(0.02)
    trainer.close()
    rollout.close()
    return trace_dir


def assert_safe(text: str) -> None:
    raw = [hex(ord(c)) for c in RAW if c in text]
    assert not raw, f"raw control characters reached the output: {raw}"
    assert "\\x1b[2J[bold]step\\u202e" + LINK in text  # shown escaped, markup as typed


def test_trace_strings_reach_the_terminal_escaped(hostile_trace, tmp_path):
    path = next(hostile_trace.glob("trainer0.*.jsonl"))
    with open(path, "ab") as f:  # a skipped line whose reason quotes trace text
        f.write(json.dumps({"k": "\x1b]0;PWNED\x07[bold]"}).encode() + b"\n")
    summary = runner.invoke(cli, ["trace-view", str(hostile_trace), "--summary"])
    assert summary.exit_code == 0, summary.output
    assert_safe(summary.output)
    assert "skipped 1 unusable lines" in summary.output and "\\x1b]0;PWNED\\x07[bold]" in summary.output

    out = tmp_path / "perfetto.json"  # an export is data: exact names, JSON escaping only
    assert runner.invoke(cli, ["trace-view", str(hostile_trace), "--export", "perfetto", str(out)]).exit_code == 0
    events = json.loads(out.read_text())["traceEvents"]
    assert {NAME, "generate"} <= {e["name"] for e in events}
    assert any(e.get("args", {}).get(KEY) == VALUE for e in events)

    import asyncio

    asyncio.run(_viewer_screens_are_safe(hostile_trace))


async def _viewer_screens_are_safe(trace_dir) -> None:
    trace = load_trace(trace_dir)
    app = TraceViewerApp(trace, str(trace_dir))
    async with app.run_test(size=(200, 40)) as pilot:
        timeline = app.query_one(Timeline)
        await pilot.press("space")  # expand the requests: a row labelled with the request id
        screens = []
        for name in (NAME, "checkpoint", "generate"):  # the details of each span
            timeline.select(int((trace.spans.name == trace.names.index(name)).argmax()))
            await pilot.pause()
            screens.append(app.export_screenshot())
        await pilot.press("slash", *"status=error", "enter", "2")  # the summary tab under a filter
        await pilot.pause()
        screens.append(app.export_screenshot())
        await pilot.press("1", "slash", "escape", "2", "enter")  # filter by the longest span's name
        await pilot.pause()
        screens.append(app.export_screenshot())
        assert int(timeline.lanes.span_mask.sum()) == 1  # the name as shown matches the name as recorded
        assert timeline.trace.names[int(timeline.trace.spans.name[timeline.lanes.span_mask][0])] == NAME
    text = html.unescape("\n".join(screens)).replace("\xa0", " ")
    assert_safe(text)
    for escaped in (
        "rollout\\x1b]0;PWNED\\x07[i]0",
        "req\\x9b5m[blink]",
        "key\\x1b[8m",
        "value\\u2066[red]\\x00[link=",
        "boom\\r\\x1b[1A[bold red]fine",
    ):
        assert escaped in text, escaped


def sparse(path, size: int, head: bytes = b""):
    """A file of ``size`` bytes that holds ``head`` and then a hole (no disk used)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


@pytest.mark.parametrize("what", ["summary", "export", "viewer"])
def test_a_huge_file_is_refused_by_its_first_line_or_its_first_absurd_line(small_trace, tmp_path, what):
    header = next(small_trace.glob("trainer0.*.jsonl")).read_bytes().split(b"\n")[0] + b"\n"
    args = {
        "summary": ["--summary"],
        "export": ["--export", "perfetto", str(tmp_path / "out.json")],
        "viewer": ["--screenshot", str(tmp_path / "out.svg")],
    }[what]
    cases = [
        (sparse(tmp_path / "not-a-trace.jsonl", 64 << 30), "not-a-trace.jsonl is not an rlx trace"),
        (
            sparse(tmp_path / "holed.1.jsonl", 64 << 30, header + b'{"k":"I","n":"x","t":1}\n'),
            "holed.1.jsonl:3: a line longer than 64 MiB",
        ),
    ]
    if what == "viewer":  # the run's metrics file, read for the Metrics tab
        sparse(small_trace.parent / "metrics.jsonl", 64 << 30, b'{"step": 0}\n')
        cases.append((small_trace, "metrics.jsonl:2: a line longer than 1 MiB"))
    for path, message in cases:
        result = runner.invoke(cli, ["trace-view", str(path), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.svg").exists()
