"""The columnar trace cache: a re-opened trace equals the parsed one; a changed trace, a corrupt or
forged cache are never used (the trace is parsed again and the cache rewritten)."""

from __future__ import annotations

import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest

from rlx.trace import columnar
from rlx.trace.cache import MAGIC, BadCache, PackedStrings, TraceCache
from rlx.trace.cache import _read as read_cache
from rlx.trace.loader import find_trace_files, load_trace
from rlx.trace.query import match_spans
from rlx.trace.synthetic import write_synthetic_trace
from tests.trace.test_trace_columnar import assert_same_trace

pytest.importorskip("pyarrow")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("RLX_TRACE_CACHE", str(directory))
    return directory


def load_and_cache(path):
    """Load (parsing, or from the cache) and wait for the background cache writer."""
    trace = load_trace(path)
    for thread in threading.enumerate():
        if thread.name == "rlx-trace-cache":
            thread.join()
    return trace


def from_cache(trace) -> bool:
    return isinstance(trace.request_ids, PackedStrings)


@pytest.fixture
def mixed_trace(tmp_path):
    """Complete and long (begin + end) spans, instant events, an error, two files."""
    path = tmp_path / "mixed"
    write_synthetic_trace(path, num_entries=3000, num_servers=2, requests_per_step=64)
    return path


def test_reopening_reads_the_cache_and_shows_the_same_trace(small_trace, mixed_trace, cache_dir):
    for path in (small_trace, mixed_trace):
        parsed = load_and_cache(path)
        assert not from_cache(parsed) and len(list(cache_dir.glob("*.rlxtc"))) >= 1
        cached = load_and_cache(path)
        assert from_cache(cached)
        assert_same_trace(cached, parsed)
        assert [(p.name, p.role, p.pid, p.host, p.path, p.offset_ns, p.end_ns) for p in cached.processes] == [
            (p.name, p.role, p.pid, p.host, p.path, p.offset_ns, p.end_ns) for p in parsed.processes
        ]
        assert cached.origin_wall_ns == parsed.origin_wall_ns and cached.end_ns == parsed.end_ns
        assert np.array_equal(cached.spans.end_attrs.owner, parsed.spans.end_attrs.owner)
        for i in range(len(parsed.spans.end_attrs)):
            assert bytes(cached.spans.end_attrs.attrs[i]) == bytes(parsed.spans.end_attrs.attrs[i])
    small = load_trace(small_trace)
    assert from_cache(small) and small.spans.errors  # the failed checkpoint
    for query in ("finish_reason=length", "prompt_tokens>12", "budget=8", "name=generate"):
        assert np.array_equal(match_spans(small, query), match_spans(load_trace(small_trace, cache=False), query))


def test_a_reopened_trace_imports_no_pyarrow_until_an_attribute_is_shown(small_trace, cache_dir):
    load_and_cache(small_trace)
    code = (
        "import sys; from rlx.trace.loader import load_trace; t = load_trace(sys.argv[1]); "
        "print(type(t.request_ids).__name__, 'pyarrow' in sys.modules, sorted(t.span_attrs(0)), 'pyarrow' in "
        "sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(small_trace)], capture_output=True, text=True, check=True)
    shown = sorted(load_trace(small_trace, cache=False).span_attrs(0))
    assert out.stdout.strip() == f"PackedStrings False {shown} True"


def test_line_references_are_found_without_pyarrow_too(small_trace, cache_dir, monkeypatch):
    load_and_cache(small_trace)
    parsed = load_trace(small_trace, cache=False)
    expected = [parsed.span_attrs(i) for i in range(len(parsed.spans))]  # line bounds found by pyarrow
    monkeypatch.setattr(columnar, "arrow", lambda: False)  # pyarrow uninstalled since the cache was written
    cached = load_trace(small_trace)
    assert from_cache(cached)
    assert [cached.span_attrs(i) for i in range(len(cached.spans))] == expected


def test_a_changed_trace_is_parsed_again(small_trace, cache_dir):
    before = load_and_cache(small_trace)
    path = next(f for f in small_trace.glob("*.jsonl") if f.name.startswith("trainer0"))
    with open(path, "ab") as f:
        f.write(b'{"k":"X","i":999,"n":"late_span","t":5,"d":7}\n')
    after = load_and_cache(small_trace)
    assert not from_cache(after) and len(after.spans) == len(before.spans) + 1 and "late_span" in after.names
    assert len(list(cache_dir.glob("*.rlxtc"))) == 1  # the earlier state's cache was removed
    assert from_cache(load_trace(small_trace))  # the rewritten cache holds the new span
    assert "late_span" in load_trace(small_trace).names
    (small_trace / "extra.7.jsonl").write_bytes(path.read_bytes().replace(b'"pid":', b'"pid":7', 1))
    added = load_and_cache(small_trace)
    assert not from_cache(added) and len(added.processes) == 3


def _fix_crc(data: bytearray) -> None:
    data[-4:] = zlib.crc32(memoryview(data)[:-4]).to_bytes(4, "little")


def _forge_index(data: bytearray) -> None:
    """Point the first span's parent past every span, with the checksum made right again."""
    _, arrays = read_cache(data)
    base = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    offset = arrays["span_parent"].__array_interface__["data"][0] - base
    data[offset : offset + 4] = (10**9).to_bytes(4, "little")
    _fix_crc(data)


def _forge_time(data: bytearray) -> None:
    """A trace origin past int64 (same length, checksum made right again)."""
    at = data.index(b'"origin_wall_ns":') + len(b'"origin_wall_ns":')
    end = data.index(b",", at)
    data[at:end] = b"9" * (end - at)  # 19 nines > 2**63 - 1
    _fix_crc(data)


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a cache", "forged index", "forged time", "empty"])
def test_a_corrupt_or_forged_cache_is_ignored_and_rebuilt(small_trace, cache_dir, damage):
    parsed = load_and_cache(small_trace)
    (cache_file,) = cache_dir.glob("*.rlxtc")
    data = bytearray(cache_file.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[len(data) - 100] ^= 0xFF
    elif damage == "not a cache":
        data[: len(MAGIC)] = b"x" * len(MAGIC)
        _fix_crc(data)
    elif damage == "forged time":
        _forge_time(data)
    elif damage == "forged index":
        _forge_index(data)
        with pytest.raises(BadCache, match="out of range"):  # the checksum passes, the range check does not
            TraceCache(find_trace_files(small_trace), cache_dir)._decode(data)
    else:
        data = bytearray()
    cache_file.write_bytes(bytes(data))
    reopened = load_and_cache(small_trace)
    assert not from_cache(reopened)  # parsed again...
    assert_same_trace(reopened, parsed)
    again = load_trace(small_trace)  # ...and the cache rewritten whole
    assert from_cache(again)
    assert_same_trace(again, parsed)


def test_traces_with_unusable_lines_are_not_cached_and_the_cache_can_be_turned_off(small_trace, cache_dir, monkeypatch):
    path = next(f for f in small_trace.glob("*.jsonl") if f.name.startswith("trainer0"))
    with open(path, "ab") as f:
        f.write(b'{"k":"X", broken\n')
    for _ in range(2):
        trace = load_and_cache(small_trace)
        assert trace.skipped["malformed JSON"] == 1 and not from_cache(trace)
    assert not list(cache_dir.glob("*.rlxtc"))
    path.write_bytes(path.read_bytes().rsplit(b"\n", 2)[0] + b"\n")
    monkeypatch.setenv("RLX_TRACE_CACHE", "off")
    load_and_cache(small_trace)
    assert not list(cache_dir.glob("*.rlxtc")) and find_trace_files(small_trace)
