"""`rlx trace-view`: summary and export without the TUI, screenshots, and clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["trace-view", *map(str, args)])


def test_summary_prints_the_table_sorted(small_trace):
    result = invoke(small_trace, "--summary", "--sort", "count")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "2 processes" in result.output
    body = [line for line in lines if line.startswith("│")]
    counts = [int(line.split("│")[2]) for line in body]
    assert counts == sorted(counts, reverse=True)
    assert any("generate" in line for line in body) and any("checkpoint" in line for line in body)


def test_summary_with_a_filter(small_trace):
    result = invoke(small_trace, "--summary", "--filter", "proc=trainer0 dur>0ms")
    assert result.exit_code == 0, result.output
    assert "generate" not in result.output and "step" in result.output


def test_export_perfetto_writes_chrome_trace_json(small_trace, tmp_path):
    out = tmp_path / "out.json"
    result = invoke(small_trace, "--export", "perfetto", out)
    assert result.exit_code == 0, result.output
    assert "ui.perfetto.dev" in result.output
    assert any(e["ph"] == "X" and e["name"] == "generate" for e in json.loads(out.read_text())["traceEvents"])


def test_screenshot_saves_an_svg_of_the_timeline(small_trace, tmp_path):
    out = tmp_path / "docs" / "shot.svg"
    result = invoke(small_trace, "--screenshot", out, "--size", "120x30", "--window", "0s:1s")
    assert result.exit_code == 0, result.output
    svg = out.read_text()
    assert svg.startswith("<svg") and "rollout0" in svg and "trainer0" in svg


def test_truncated_trace_reports_skipped_lines_and_still_summarises(small_trace):
    path = sorted(small_trace.glob("trainer0.*.jsonl"))[0]
    path.write_bytes(path.read_bytes() + b'{"k":"B","i":99')
    result = invoke(small_trace, "--summary")
    assert result.exit_code == 0
    assert "skipped 1 unusable lines" in result.output and "truncated last line" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--export", "svg", "x.svg"], "use --export perfetto"),
        (["--summary", "--sort", "speed"], "--sort speed"),
        (["--summary", "--filter", "dur=1"], "--filter"),
        (["--screenshot", "x.svg", "--window", "5s"], "START:END"),
        (["--screenshot", "x.svg", "--size", "big"], "COLUMNSxROWS"),
        ([], "needs a terminal"),
    ],
)
def test_bad_options_are_one_line_errors(small_trace, args, message):
    result = invoke(small_trace, *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_missing_path_and_directory_without_traces(tmp_path):
    result = invoke(tmp_path / "missing", "--summary")
    assert result.exit_code == 2 and "no such trace file or directory" in result.output
    result = invoke(tmp_path, "--summary")
    assert result.exit_code == 2 and "no rlx trace files" in result.output


def test_the_trace_of_a_run_that_recorded_none_names_trace_enabled(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("trace: {enabled: false}\n")
    result = invoke(tmp_path / "run" / "trace", "--summary")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "recorded no trace" in text and "trace.enabled=true" in text, text


def test_a_misspelled_filter_key_is_refused_with_the_keys_the_trace_has(small_trace):
    result = invoke(small_trace, "--summary", "--filter", "rol=trainer")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "no span or event of this trace has 'rol'" in text, text
    assert "did you mean 'role'?" in text and "finish_reason" in text
    assert invoke(small_trace, "--summary", "--filter", "finish_reason=nothing").exit_code == 0  # a real key


def test_a_window_after_the_end_of_the_trace_is_refused(small_trace, tmp_path):
    result = invoke(small_trace, "--screenshot", tmp_path / "shot.svg", "--window", "30s:33s")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "starts after the trace ends" in text and "choose a window within 0s:" in text
    assert not (tmp_path / "shot.svg").exists()


def test_the_summary_says_totals_add_up_overlapping_spans(small_trace):
    result = invoke(small_trace, "--summary")
    assert "total can exceed the wall time" in " ".join(result.output.split())


def test_export_creates_the_directory_it_writes_into(small_trace, tmp_path):
    result = invoke(small_trace, "--export", "perfetto", tmp_path / "out" / "trace.json")
    assert result.exit_code == 0 and (tmp_path / "out" / "trace.json").is_file(), result.output
