"""The tracer writes what the format says, nests across await, and never breaks the traced code."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import pytest

from rlx.trace import ENV_TRACE_DIR, NOOP_SPAN, Tracer, tracer


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def local(tmp_path):
    t = Tracer()
    t.configure(tmp_path, role="trainer", name="trainer0")
    yield t
    t.close()


def test_header_names_the_process_and_both_clocks(local, tmp_path):
    assert local.path == tmp_path / f"trainer0.{os.getpid()}.jsonl"
    header = read_lines(local.path)[0]
    assert header["k"] == "H" and header["format"] == "rlx-trace" and header["version"] == 1
    assert (header["name"], header["role"], header["pid"]) == ("trainer0", "trainer", os.getpid())
    assert header["wall_ns"] > 1_600_000_000 * 10**9 and header["mono_ns"] > 0


def test_nested_spans_record_parent_attributes_and_request_id(local):
    with local.span("step", step=3):
        with local.span("generate", request_id="r1", prompt_tokens=7) as span:
            span.set(completion_tokens=12, finish_reason="stop")
        local.event("queued", request_id="r2", depth=4)
    gen, event, step = read_lines(local.path)[1:]  # one complete line per span, at its end
    assert step == {"k": "X", "i": 1, "n": "step", "t": step["t"], "d": step["d"], "a": {"step": 3}}
    assert gen["k"] == "X" and gen["i"] == 2 and gen["p"] == 1 and gen["r"] == "r1"
    assert gen["a"] == {"prompt_tokens": 7, "completion_tokens": 12, "finish_reason": "stop"}
    assert event == {"k": "I", "n": "queued", "t": event["t"], "p": 1, "r": "r2", "a": {"depth": 4}}
    assert step["t"] <= gen["t"] <= gen["t"] + gen["d"] <= event["t"] <= step["t"] + step["d"]


def test_parents_follow_each_task_across_await(local):
    async def request(i):
        with local.span("request", request_id=i):
            await asyncio.sleep(0.001 * (3 - i))
            with local.span("inner", i=i):
                await asyncio.sleep(0)

    async def main():
        with local.span("outer"):
            await asyncio.gather(*(request(i) for i in range(3)))

    asyncio.run(main())
    spans = {line["i"]: line for line in read_lines(local.path)[1:]}
    assert len(spans) == 7 and all(line["k"] == "X" for line in spans.values())
    request_ids = {b["r"]: i for i, b in spans.items() if b["n"] == "request"}
    for b in spans.values():
        if b["n"] == "request":
            assert b["p"] == 1  # the outer span
        if b["n"] == "inner":
            assert b["p"] == request_ids[b["a"]["i"]]


def test_long_spans_get_a_begin_line_while_still_open(tmp_path):
    t = Tracer()
    t.configure(tmp_path, role="trainer", name="trainer0", open_span_flush_s=0.05)
    with t.span("checkpoint", step=1, request_id="r") as span:
        deadline = time.monotonic() + 5
        while len(read_lines(t.path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the watcher thread writes the begin line meanwhile
        span.set(bytes=10)
    with t.span("short"):
        pass
    t.close()
    header, begin, end, short = read_lines(t.path)
    assert begin == {"k": "B", "i": 1, "n": "checkpoint", "t": begin["t"], "r": "r", "a": {"step": 1}}
    assert end == {"k": "E", "i": 1, "t": end["t"], "a": {"bytes": 10}}
    assert short["k"] == "X" and short["n"] == "short"


def test_exception_is_recorded_and_reraised_unchanged(local):
    error = KeyError("missing")
    with pytest.raises(KeyError) as caught, local.span("reward"):
        raise error
    assert caught.value is error
    end = read_lines(local.path)[-1]
    assert end["k"] == "X" and end["err"] == "KeyError: 'missing'"
    with local.span("after"):
        pass
    assert "p" not in read_lines(local.path)[-1]  # top level again: the failed span is no parent


def test_traced_decorator_wraps_sync_and_async_functions(local):
    @local.traced("reward")
    def score(x):
        return x * 2

    @local.traced()
    async def fetch(x):
        await asyncio.sleep(0)
        return x + 1

    assert score(4) == 8
    assert asyncio.run(fetch(1)) == 2
    names = [line["n"] for line in read_lines(local.path) if line["k"] == "X"]
    assert names == ["reward", fetch.__wrapped__.__qualname__]


def test_disabled_tracer_is_a_noop_and_writes_nothing(tmp_path):
    t = Tracer()
    assert not t.enabled
    span = t.span("x", a=1)
    assert span is NOOP_SPAN
    with span as s:
        s.set(b=2)
    t.event("e", c=3)
    assert t.traced("f")(lambda: 5)() == 5
    t.flush()
    t.close()
    assert list(tmp_path.iterdir()) == []


def test_attributes_json_cannot_hold_are_replaced_by_the_reason(local):
    loop = []
    loop.append(loop)
    with local.span("x", nested={(1, 2): "tuple key"}):
        pass
    with local.span("y", loop=loop):
        pass
    x, y = [line for line in read_lines(local.path) if line["k"] == "X"]
    assert x["a"] == {"nested": {"(1, 2)": "tuple key"}}  # keys JSON cannot hold become str()
    assert y["n"] == "y" and "not JSON-serialisable" in y["a"]["trace_error"]


def test_unserialisable_attribute_values_become_strings(local):
    class Thing:
        def __str__(self):
            return "thing!"

    with local.span("x", obj=Thing(), count=7):
        pass
    assert read_lines(local.path)[1]["a"] == {"obj": "thing!", "count": 7}


def test_a_failing_trace_file_stops_tracing_without_breaking_the_caller(local, capsys):
    os.close(local._fd)  # the file vanishes underneath the tracer (EBADF on the next write)
    with local.span("x"):
        result = 42
    assert result == 42
    assert not local.enabled
    assert "tracing to" in capsys.readouterr().err


def test_spans_open_across_close_are_left_unfinished(local):
    span = local.span("checkpoint")
    span.__enter__()
    local.close()
    span.__exit__(None, None, None)
    assert [line["k"] for line in read_lines(local.path)] == ["H", "B"]


def test_threads_write_whole_lines(local):
    def work(k):
        for i in range(200):
            with local.span("t", thread=k, i=i):
                pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = read_lines(local.path)
    assert len(lines) == 1 + 4 * 200
    assert len({line["i"] for line in lines if line["k"] == "X"}) == 800


def test_configure_from_env_enables_only_when_the_variable_is_set(tmp_path, monkeypatch):
    t = Tracer()
    monkeypatch.delenv(ENV_TRACE_DIR, raising=False)
    assert t.configure_from_env("rollout", "rollout0") is False and not t.enabled
    monkeypatch.setenv(ENV_TRACE_DIR, str(tmp_path / "trace"))
    assert t.configure_from_env("rollout", "rollout0") is True and t.enabled
    t.close()
    assert (tmp_path / "trace" / f"rollout0.{os.getpid()}.jsonl").is_file()


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_bad_names_are_refused_with_the_fix(tmp_path, name):
    with pytest.raises(ValueError, match="file-name part"):
        Tracer().configure(tmp_path, role="trainer", name=name)


def test_unwritable_trace_dir_names_the_setting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="trace.dir"):
        Tracer().configure(blocker / "trace", role="trainer", name="trainer0")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_its_own_file_only_if_it_traces(tmp_path):
    tracer.configure(tmp_path, role="rollout", name="rollout0")
    try:
        with tracer.span("before_fork"):
            quiet = os.fork()
            if quiet == 0:
                os._exit(0)  # a helper process that traces nothing
            pid = os.fork()
            if pid == 0:
                try:
                    with tracer.span("in_child"):
                        pass
                finally:
                    os._exit(0)
        os.waitpid(quiet, 0)
        os.waitpid(pid, 0)
    finally:
        tracer.close()
    child = read_lines(tmp_path / f"rollout0.{pid}.jsonl")
    assert [line["k"] for line in child] == ["H", "X"]  # nothing of the parent's open span
    assert child[0]["pid"] == pid and child[1]["n"] == "in_child"
    assert not (tmp_path / f"rollout0.{quiet}.jsonl").exists()
    parent = read_lines(tmp_path / f"rollout0.{os.getpid()}.jsonl")
    assert [line.get("n") for line in parent] == [None, "before_fork"]


def test_importing_the_tracer_stays_light():
    import subprocess

    code = (
        "import sys, rlx.trace; from rlx.trace import tracer; "
        "print(','.join(m for m in ('numpy', 'textual', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
