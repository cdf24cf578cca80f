"""Loading: real tracer files become one timeline; bad lines are skipped and counted, never fatal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlx.trace.loader import find_trace_files, load_trace
from rlx.trace.model import STATUS_ERROR, STATUS_OK, STATUS_UNFINISHED
from rlx.trace.reader import TraceError


def names_of(trace, mask=None):
    idx = range(len(trace.spans)) if mask is None else mask.nonzero()[0]
    return [trace.names[trace.spans.name[i]] for i in idx]


def test_small_run_loads_with_parents_requests_and_errors(small_trace):
    trace = load_trace(small_trace)
    assert sorted(p.name for p in trace.processes) == ["rollout0", "trainer0"]
    assert trace.num_skipped == 0
    spans = trace.spans
    assert names_of(trace).count("generate") == 12 and names_of(trace).count("step") == 2
    gen = [i for i, n in enumerate(names_of(trace)) if n == "generate"]
    attrs = trace.span_attrs(gen[0])
    assert {"prompt_tokens", "completion_tokens", "finish_reason", "request_id"} <= set(attrs)
    assert all(spans.request[i] >= 0 for i in gen)
    update = names_of(trace).index("update.micro_batch")
    assert names_of(trace)[spans.parent[update]] == "step" and spans.depth[update] == 1
    checkpoints = [i for i, n in enumerate(names_of(trace)) if n == "checkpoint"]
    assert [int(spans.status[i]) for i in checkpoints] == [STATUS_OK, STATUS_ERROR]
    assert spans.errors[checkpoints[1]] == "OSError: disk full"
    assert (spans.end >= spans.start).all()
    assert len(trace.events) == 12 and (trace.events.request >= 0).all()  # inherited from generate


def test_processes_share_one_timeline(small_trace):
    trace = load_trace(small_trace)
    spans = trace.spans
    rollout = [i for i, n in enumerate(names_of(trace)) if n == "rollout"]
    generate = [i for i, n in enumerate(names_of(trace)) if n == "generate"]
    first_rollout = spans.start[rollout[0]], spans.end[rollout[0]]
    # the rollout server's generations of step 0 happen inside the trainer's first "rollout" span
    inside = [i for i in generate if first_rollout[0] <= spans.start[i] <= first_rollout[1]]
    assert len(inside) == 6
    assert spans.proc[inside[0]] != spans.proc[rollout[0]]


def test_run_dir_and_single_file_are_accepted(small_trace):
    run_dir = small_trace.parent
    assert find_trace_files(run_dir) == find_trace_files(small_trace)
    one = find_trace_files(small_trace)[0]
    assert len(load_trace(one).processes) == 1


def test_missing_path_and_empty_dir_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace"):
        load_trace(tmp_path / "nope")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    os.mkfifo(tmp_path / "pipe.jsonl")  # passed over, not opened (opening it would wait for a writer)
    with pytest.raises(TraceError, match="trace.enabled=true"):
        load_trace(tmp_path)
    with pytest.raises(TraceError, match="not an rlx trace"):
        load_trace(tmp_path / "metrics.jsonl")


def test_newer_format_is_refused_with_the_fix(small_trace):
    path = find_trace_files(small_trace)[0]
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = 99
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    with pytest.raises(TraceError, match="upgrade rlx"):
        load_trace(path)


def test_truncated_last_line_is_skipped_and_counted(small_trace):
    path = [p for p in find_trace_files(small_trace) if p.name.startswith("trainer0")][0]
    before = len(load_trace(path).spans)
    data = path.read_bytes()
    path.write_bytes(data + b'{"k":"X","i":999,"n":"step","t":12')  # a crash mid-write
    trace = load_trace(path)
    assert trace.skipped == {"truncated last line": 1}
    assert len(trace.spans) == before


def test_malformed_lines_in_the_middle_are_skipped_with_reasons(small_trace):
    path = [p for p in find_trace_files(small_trace) if p.name.startswith("rollout0")][0]
    good = load_trace(path)
    lines = path.read_text().splitlines()
    lines[3:3] = [
        "not json at all",
        "",
        '{"k":"Z","x":1}',
        '{"k":"X","i":"seven"}',
        '{"k":"X","i":1,"n":"x","t":100000000000000000000000,"d":1}',
    ]  # no int64
    path.write_text("\n".join(lines) + "\n")
    trace = load_trace(path)
    assert trace.num_skipped == 5
    assert trace.skipped["malformed JSON"] == 1 and trace.skipped["blank line"] == 1
    assert sum(n for reason, n in trace.skipped.items() if reason.startswith("not a trace record")) == 3
    assert len(trace.spans) == len(good.spans) and len(trace.events) == len(good.events)
    assert trace.skipped_examples[0] == f"{path.name}:4: malformed JSON"  # file:line of the first bad line


def test_end_without_begin_is_counted(small_trace):
    path = find_trace_files(small_trace)[0]
    with open(path, "a") as f:
        f.write('{"k":"E","i":123456,"t":5}\n')
    assert load_trace(path).skipped["span end without its begin"] == 1


def test_a_killed_process_leaves_unfinished_spans(tmp_path):
    code = textwrap.dedent(f"""
        import os
        from rlx.trace import tracer
        import time
        from rlx.trace import tracer
        tracer.configure({str(tmp_path)!r}, role="trainer", name="trainer0", open_span_flush_s=0.05)
        with tracer.span("step", step=0):
            with tracer.span("sync"):
                with tracer.span("sync.pack", bucket_id=0):
                    pass
                time.sleep(0.5)  # open long enough for the begin lines to be written
                os._exit(1)
    """)
    subprocess.run([sys.executable, "-c", code], check=False)
    trace = load_trace(tmp_path)
    status = dict(zip(names_of(trace), trace.spans.status.tolist(), strict=True))
    assert status == {"step": STATUS_UNFINISHED, "sync": STATUS_UNFINISHED, "sync.pack": STATUS_OK}
    assert trace.spans.end.max() == trace.processes[0].end_ns  # drawn up to the last line written
    assert trace.num_skipped == 0


def test_a_begin_line_that_raced_with_the_complete_line_is_one_span(tmp_path):
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
        {"k": "X", "i": 1, "n": "sync", "t": 0, "d": 40, "a": {"bucket_id": 3}},
        {"k": "B", "i": 1, "n": "sync", "t": 0, "a": {"bucket_id": 3}},
        {"k": "B", "i": 2, "n": "checkpoint", "t": 10, "a": {"step": 1}},
        {"k": "E", "i": 2, "t": 90, "a": {"bytes": 5}, "err": "OSError: disk full"},
    ]
    (tmp_path / "t.1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = load_trace(tmp_path)
    assert names_of(trace) == ["sync", "checkpoint"]
    assert trace.spans.duration.tolist() == [40, 80]
    assert trace.spans.status.tolist() == [STATUS_OK, STATUS_ERROR]
    assert trace.span_attrs(1) == {"step": 1, "bytes": 5}


def test_chunked_reading_keeps_everything_and_line_numbers(small_trace, monkeypatch):
    from rlx.trace import reader

    path = [p for p in find_trace_files(small_trace) if p.name.startswith("rollout0")][0]
    whole = load_trace(path)
    lines = path.read_text().splitlines()
    lines.insert(20, "garbage")
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(reader, "CHUNK_BYTES", 300)  # many small chunks
    chunked = load_trace(path)
    assert len(chunked.spans) == len(whole.spans) and len(chunked.events) == len(whole.events)
    assert sorted(chunked.spans.start.tolist()) == sorted(whole.spans.start.tolist())
    assert chunked.skipped_examples == [f"{path.name}:21: malformed JSON"]
