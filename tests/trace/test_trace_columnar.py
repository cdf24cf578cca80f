"""The columnar fast path reads a trace exactly as the line-by-line reader does, and hands every
file it cannot read exactly (bad, blank or cut lines, odd field types) to that reader."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rlx.trace import loader
from rlx.trace.loader import load_trace
from rlx.trace.model import STATUS_UNFINISHED
from rlx.trace.query import match_spans
from rlx.trace.reader import read_trace_columns
from rlx.trace.replicate import replicate_trace
from rlx.trace.synthetic import write_synthetic_trace
from rlx.trace.tracer import Tracer

pytest.importorskip("pyarrow")

SPAN_COLUMNS = ("proc", "name", "start", "end", "parent", "depth", "request", "status")
EVENT_COLUMNS = ("proc", "name", "time", "parent", "request")


def load_line_by_line(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(loader, "read_trace_columns", lambda p: None)
        return load_trace(path)


def assert_same_trace(fast, slow):
    assert fast.names == slow.names and fast.request_ids == slow.request_ids
    assert [p.name for p in fast.processes] == [p.name for p in slow.processes]
    for column in SPAN_COLUMNS:
        assert np.array_equal(getattr(fast.spans, column), getattr(slow.spans, column)), column
    for column in EVENT_COLUMNS:
        assert np.array_equal(getattr(fast.events, column), getattr(slow.events, column)), column
    assert fast.spans.errors == slow.spans.errors
    assert np.array_equal(fast.spans.end_attrs.owner, slow.spans.end_attrs.owner)
    assert len(fast.spans.begin_attrs) == len(slow.spans.begin_attrs) == len(fast.spans)
    assert [bytes(a) for a in fast.spans.begin_attrs] == [bytes(a) for a in slow.spans.begin_attrs]
    assert [fast.span_attrs(i) for i in range(len(fast.spans))] == [slow.span_attrs(i) for i in range(len(slow.spans))]
    assert [fast.event_attrs(i) for i in range(len(fast.events))] == [
        slow.event_attrs(i) for i in range(len(slow.events))
    ]
    assert fast.skipped == slow.skipped


def test_real_tracer_files_take_the_fast_path_and_match(small_trace, monkeypatch):
    files = sorted(small_trace.glob("*.jsonl"))
    assert all(read_trace_columns(f) is not None for f in files)
    fast, slow = load_trace(small_trace), load_line_by_line(small_trace, monkeypatch)
    assert_same_trace(fast, slow)
    assert fast.spans.errors  # the failed checkpoint came through the err column


def test_the_fast_path_leaves_pandas_unimported(small_trace):
    """pyarrow's own numpy conversions import pandas on first use: a fifth of a second of every open."""
    code = (
        "import sys; from rlx.trace.loader import load_trace; t = load_trace(sys.argv[1], cache=False); "
        "print(len(t.spans), 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(small_trace)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(load_trace(small_trace).spans)), "False"]


def test_synthetic_trace_with_long_spans_and_events_matches(tmp_path, monkeypatch):
    write_synthetic_trace(tmp_path, num_entries=3000, num_servers=2, requests_per_step=64)
    fast, slow = load_trace(tmp_path), load_line_by_line(tmp_path, monkeypatch)
    assert len(fast.spans) > 2000 and len(fast.events) > 0
    assert_same_trace(fast, slow)


def test_a_trace_replicated_from_a_real_run_keeps_its_mix_and_matches(tmp_path, monkeypatch):
    """``replicate.py`` (the benchmark's input): copies after each other, ids distinct per copy."""
    tracer = Tracer()
    tracer.configure(tmp_path / "real", role="rollout", name="rollout0", open_span_flush_s=0.001)
    for k in range(3):
        tracer.event("queued", request_id=f"{k}.0", paused=False)
        with tracer.span("generate", request_id=f"{k}.0", n=1) as span:
            tracer.flush(min_age_s=0.0)  # a long generation: begin + end lines
            span.set(completion_tokens=k)
        with tracer.span("reward"):
            pass
    tracer.close()
    one = load_trace(tmp_path / "real")
    replicate_trace(tmp_path / "real", tmp_path / "big", num_entries=5 * (len(one.spans) + len(one.events)))
    fast, slow = load_trace(tmp_path / "big"), load_line_by_line(tmp_path / "big", monkeypatch)
    assert_same_trace(fast, slow)
    assert (len(fast.spans), len(fast.events), len(fast.request_ids)) == (30, 15, 15)
    length = one.end_ns - one.spans.start.min()  # each further copy starts after the previous one ended
    assert fast.spans.start.min() == one.spans.start.min() and fast.end_ns - one.end_ns > 4 * length
    assert (fast.events.parent == -1).all() and (fast.spans.parent == -1).all()
    generate = fast.spans.name == fast.names.index("generate")
    assert (fast.spans.status[generate] == 0).all() and len(fast.spans.end_attrs) == 15
    assert sorted(fast.span_attrs(i)["completion_tokens"] for i in np.flatnonzero(generate)) == sorted([0, 1, 2] * 5)


def test_unfinished_long_span_matches(tmp_path, monkeypatch):
    tracer = Tracer()
    tracer.configure(tmp_path, role="trainer", name="trainer0", open_span_flush_s=0.001)
    span = tracer.span("hang", step=3)
    span.__enter__()
    with tracer.span("inner", request_id="r1"):
        pass
    tracer.flush(min_age_s=0.0)  # writes the begin line of the open span
    fast, slow = load_trace(tmp_path), load_line_by_line(tmp_path, monkeypatch)
    assert_same_trace(fast, slow)
    assert int((fast.spans.status == STATUS_UNFINISHED).sum()) == 1
    span.__exit__(None, None, None)
    tracer.close()


@pytest.mark.parametrize(
    "bad",
    [
        b'{"k":"X","i":99,"n":"x","t":1,"d":1\n',  # malformed JSON
        b"\n",  # blank line
        b'{"k":"X","i":99,"n":"x","t":1,"d":1,"r":7}\n',  # integer request id
        b'{"k":"Z","i":99,"n":"x","t":1}\n',  # unknown kind
        b'{"k":"X","i":99,"t":1,"d":1}\n',  # a complete span without its name
    ],
)
def test_files_the_fast_path_cannot_read_exactly_go_line_by_line(small_trace, monkeypatch, bad):
    path = next(f for f in small_trace.glob("*.jsonl") if f.name.startswith("trainer0"))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + [bad] + lines[3:]))
    assert read_trace_columns(path) is None
    fast, slow = load_trace(small_trace), load_line_by_line(small_trace, monkeypatch)
    assert_same_trace(fast, slow)


def test_cut_last_line_goes_line_by_line(small_trace):
    path = next(f for f in small_trace.glob("*.jsonl") if f.name.startswith("rollout0"))
    path.write_bytes(path.read_bytes()[:-10])
    assert read_trace_columns(path) is None
    assert load_trace(small_trace).skipped["truncated last line"] == 1


def test_attribute_filter_over_lazy_attributes(small_trace, monkeypatch):
    fast, slow = load_trace(small_trace), load_line_by_line(small_trace, monkeypatch)
    for query in ("finish_reason=length", "prompt_tokens>12", "budget=8", "micro_batch=1", "step=1"):
        assert np.array_equal(match_spans(fast, query), match_spans(slow, query)), query
    assert int(match_spans(fast, "finish_reason=length").sum()) == 2
    with pytest.raises(IndexError):
        fast.spans.begin_attrs[len(fast.spans)]


def test_records_written_with_other_key_orders_are_found_without_the_prefix(tmp_path, monkeypatch):
    write_synthetic_trace(tmp_path, num_entries=2000, num_servers=1, requests_per_step=32)
    path = max(tmp_path.glob("rollout0.*.jsonl"), key=lambda p: p.stat().st_size)
    lines = path.read_bytes().split(b"\n")
    # an event and a begin line as another writer might order their keys: kind last
    events = [k for k, line in enumerate(lines) if line.startswith(b'{"k":"I"')]
    assert events, "the synthetic trace should hold instant events"
    lines[events[0]] = b"{" + lines[events[0]][len(b'{"k":"I",') :] + b',"k":"I"}'
    lines[events[0]] = lines[events[0]].replace(b'},"k":"I"}', b',"k":"I"}')
    path.write_bytes(b"\n".join(lines))
    assert read_trace_columns(path) is not None  # still the fast path
    assert_same_trace(load_trace(tmp_path), load_line_by_line(tmp_path, monkeypatch))


def test_request_ids_across_files_and_from_end_lines(tmp_path, monkeypatch):
    header = (
        '{"k":"H","format":"rlx-trace","version":1,"name":"%s","role":"rollout","pid":%d,'
        '"host":"h","wall_ns":1000,"mono_ns":0}\n'
    )
    (tmp_path / "rollout0.1.jsonl").write_text(
        header % ("rollout0", 1)
        + '{"k":"X","i":1,"n":"generate","t":1,"d":5,"r":"req-a"}\n'
        + '{"k":"B","i":2,"n":"wait","t":2}\n'  # names no request...
        + '{"k":"E","i":2,"t":9,"r":"req-late"}\n'  # ...its end line does
        + '{"k":"B","i":3,"n":"hold","t":3,"r":"req-b"}\n'
        + '{"k":"E","i":3,"t":8,"r":"req-other"}\n'  # the begin's id stands
        + '{"k":"I","n":"tick","t":4,"r":"req-c"}\n'
    )
    (tmp_path / "rollout1.2.jsonl").write_text(
        header % ("rollout1", 2) + '{"k":"X","i":1,"n":"generate","t":1,"d":5,"r":"req-b"}\n'
    )
    fast, slow = load_trace(tmp_path), load_line_by_line(tmp_path, monkeypatch)
    assert_same_trace(fast, slow)
    ids = [fast.request_ids[r] for r in fast.spans.request]
    assert ids == ["req-a", "req-late", "req-b", "req-b"]  # one id for req-b in both files
    assert fast.request_ids[fast.events.request[0]] == "req-c"
    assert "req-other" not in list(fast.request_ids)


def test_integer_request_ids_stay_integers(small_trace, monkeypatch):
    path = next(f for f in small_trace.glob("*.jsonl") if f.name.startswith("trainer0"))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + [b'{"k":"X","i":99,"n":"x","t":1,"d":1,"r":7}\n'] + lines[3:]))
    trace = load_trace(small_trace)
    span = next(i for i in range(len(trace.spans)) if trace.names[trace.spans.name[i]] == "x")
    assert trace.request_ids[trace.spans.request[span]] == 7
    assert "7" not in list(trace.request_ids)
