"""Filters, the summary table, the Perfetto export and the metrics file, on real trace files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlx.trace.loader import load_trace
from rlx.trace.metrics import find_metrics_file, load_metrics
from rlx.trace.perfetto import export_perfetto
from rlx.trace.query import match_events, match_spans, parse_query
from rlx.trace.summary import sort_rows, summarize
from rlx.trace.synthetic import write_synthetic_trace
from rlx.trace.units import format_ns, parse_duration_ns


@pytest.fixture
def trace(small_trace):
    return load_trace(small_trace)


def matched_names(trace, query):
    return sorted({trace.names[trace.spans.name[i]] for i in np.flatnonzero(match_spans(trace, query))})


def test_filters_by_name_attribute_duration_process_and_status(trace):
    assert matched_names(trace, "sync") == []
    assert matched_names(trace, "micro") == ["update.micro_batch"]
    assert matched_names(trace, "name=step") == ["step"]
    assert int(match_spans(trace, "finish_reason=length").sum()) == 2  # request 0 of both steps
    assert int(match_spans(trace, "completion_tokens>=9").sum()) == 2 * 2  # requests 4 and 5
    assert int(match_spans(trace, "prompt_tokens=10 completion_tokens=5").sum()) == 2
    assert matched_names(trace, "proc=rollout0") == ["generate", "queued"]
    assert matched_names(trace, "role=trainer status=error") == ["checkpoint"]
    assert matched_names(trace, "request_id=req-1-3") == ["generate", "queued"]
    slow = match_spans(trace, "dur>1ms")
    assert (trace.spans.duration[slow] > 1_000_000).all() and slow.any()
    assert int(match_events(trace, "budget=8").sum()) == len(trace.events)
    assert int(match_events(trace, "dur>1ms").sum()) == 0


@pytest.mark.parametrize(
    "query, message",
    [("dur=5ms", "compare durations"), ("status=sad", "one of"), ("=5", "cannot read"), ("dur>fast", "not a duration")],
)
def test_bad_filters_name_the_fix(query, message):
    with pytest.raises(ValueError, match=message):
        parse_query(query)


def test_summary_matches_a_hand_computed_reference(trace):
    rows = {r.name: r for r in summarize(trace)}
    durations = np.sort(trace.spans.duration[trace.spans.name == trace.names.index("generate")])
    gen = rows["generate"]
    assert gen.count == 12 and gen.total == durations.sum() and gen.max == durations[-1]
    assert gen.p50 == durations[5]  # nearest rank: ceil(0.5 * 12) = 6th smallest
    assert gen.p99 == durations[11]
    assert rows["checkpoint"].errors == 1 and rows["checkpoint"].count == 2
    by_count = sort_rows(list(rows.values()), "count")
    assert by_count[0].count == max(r.count for r in rows.values())
    assert [r.name for r in sort_rows(list(rows.values()), "name")] == sorted(rows)
    with pytest.raises(ValueError, match="use one of"):
        sort_rows(list(rows.values()), "speed")


def test_summary_counts_unfinished_spans_apart(tmp_path):
    path = tmp_path / "t.1.jsonl"
    header = {
        "k": "H",
        "format": "rlx-trace",
        "version": 1,
        "name": "t",
        "role": "trainer",
        "pid": 1,
        "host": "h",
        "wall_ns": 10**18,
        "mono_ns": 0,
    }
    lines = [
        header,
        {"k": "B", "i": 1, "n": "sync", "t": 0},
        {"k": "B", "i": 2, "n": "sync", "t": 10},
        {"k": "E", "i": 2, "t": 30},
        {"k": "I", "n": "tick", "t": 50},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (row,) = summarize(load_trace(path))
    assert (row.count, row.unfinished, row.total) == (1, 1, 20)


def test_perfetto_export_is_chrome_trace_json_with_nested_tracks(trace, tmp_path):
    out = tmp_path / "trace.json"
    count = export_perfetto(trace, out)
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert len(events) == count
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(trace.spans)
    assert {e["name"] for e in events if e["ph"] == "M"} >= {"process_name", "thread_name"}
    gen = next(e for e in complete if e["name"] == "generate")
    assert gen["args"]["request_id"].startswith("req-") and "finish_reason" in gen["args"]
    assert any(e["args"].get("error") == "OSError: disk full" for e in complete)
    _assert_nested_per_track(complete)


def _assert_nested_per_track(complete):
    tracks = {}
    for e in complete:
        start_ns = round(e["ts"] * 1000)  # Perfetto reads microseconds into integer nanoseconds
        tracks.setdefault((e["pid"], e["tid"]), []).append((start_ns, start_ns + round(e["dur"] * 1000)))
    for slices in tracks.values():
        stack = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], "slices on one track must nest"
            stack.append(end)


def test_perfetto_export_of_a_synthetic_run_keeps_request_tracks_few(tmp_path):
    write_synthetic_trace(tmp_path / "trace", num_entries=3000, requests_per_step=128)
    trace = load_trace(tmp_path / "trace")
    export_perfetto(trace, tmp_path / "out.json")
    events = json.loads((tmp_path / "out.json").read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    _assert_nested_per_track(complete)
    request_tracks = {(e["pid"], e["tid"]) for e in complete if "request_id" in e["args"]}
    assert len(request_tracks) <= 2 * 24 + 2  # about the number running at once per server


def test_metrics_file_skips_bad_lines_and_is_found_next_to_the_trace(small_trace):
    metrics_path = small_trace.parent / "metrics.jsonl"
    metrics_path.write_text(
        '{"step": 0, "reward_mean": 0.1}\n{"step": 1, "reward_mean": 0.3, "eval_accuracy": 0.5}\n'
        'garbage\n{"no_step": 1}\n\n{"step": 2, "reward_mean": 0.4}\n'
    )
    assert find_metrics_file(small_trace) == metrics_path
    metrics = load_metrics(metrics_path)
    assert metrics.skipped == 2
    assert metrics.series("reward_mean") == ([0, 1, 2], [0.1, 0.3, 0.4])
    assert metrics.series("eval_accuracy") == ([1], [0.5])
    with pytest.raises(FileNotFoundError, match="--metrics"):
        load_metrics(small_trace / "nope.jsonl")


def test_durations_format_and_parse():
    assert format_ns(850) == "850ns" and format_ns(12_500_000) == "12.5ms" and format_ns(3.2e9) == "3.20s"
    assert parse_duration_ns("10ms") == 10_000_000 and parse_duration_ns("1.5") == 1_500_000_000
    with pytest.raises(ValueError, match="250us"):
        parse_duration_ns("soon")


def test_queued_counts_queued_spans_and_queued_events_until_generation(tmp_path):
    from rlx.trace.concurrency import queued, running

    header = {
        "k": "H",
        "format": "rlx-trace",
        "version": 1,
        "name": "rollout0",
        "role": "rollout",
        "pid": 1,
        "host": "h",
        "wall_ns": 10**18,
        "mono_ns": 0,
    }
    lines = [
        header,
        {"k": "B", "i": 1, "n": "queued", "t": 0, "r": "a"},
        {"k": "E", "i": 1, "t": 10},
        {"k": "B", "i": 2, "n": "generate", "t": 10, "r": "a"},
        {"k": "E", "i": 2, "t": 50},
        {"k": "I", "n": "queued", "t": 5, "r": "b"},
        {"k": "B", "i": 3, "n": "generate", "t": 30, "r": "b"},
        {"k": "E", "i": 3, "t": 60},
    ]
    (tmp_path / "rollout0.1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = load_trace(tmp_path)
    q, r = queued(trace), running(trace)
    assert [q.at(t) for t in (0, 7, 20, 40)] == [1, 2, 1, 0]
    assert [r.at(t) for t in (0, 20, 40, 55, 70)] == [0, 1, 2, 1, 0]
