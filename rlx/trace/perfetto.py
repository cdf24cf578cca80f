"""Export to Chrome-trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Each process becomes a Perfetto process (named ``role: name``, ordered launcher, rollout,
trainer, sync); each span a complete event (``ph: X``) with its attributes as ``args``; each
instant event an ``i`` event. Chrome-trace slices on one thread must nest, and concurrent
requests or async tasks do not, so spans are packed greedily onto as few tracks as keep them
nested: ``main`` tracks for spans without a request id, ``requests`` tracks for the rest (about
as many as requests ran at once). Unfinished spans end where their process's trace ends and
carry ``"unfinished": true``; failed ones carry ``"error"``. Times are microseconds since the
trace origin. Protobuf output and flow arrows are left out.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from rlx.trace.model import STATUS_UNFINISHED, Trace

ROLE_ORDER = ("launcher", "rollout", "trainer", "sync")
_REQUEST_TID_BASE = 1000


def role_rank(role: str) -> int:
    return ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)


def export_perfetto(trace: Trace, out: str | Path) -> int:
    """Write the trace as Chrome-trace JSON to ``out``; returns the number of events written."""
    tids = assign_tracks(trace)
    events = _metadata(trace, tids) + _span_events(trace, tids) + _instant_events(trace, tids)
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "rlx trace-view", "origin_unix_ns": trace.origin_wall_ns},
    }
    Path(out).write_bytes(msgspec.json.encode(doc))
    return len(events)


def assign_tracks(trace: Trace) -> np.ndarray:
    """A thread id per span such that the spans of each (process, tid) nest."""
    spans = trace.spans
    tids = np.zeros(len(spans), np.int64)
    for proc in range(len(trace.processes)):
        for is_request, base in ((False, 1), (True, _REQUEST_TID_BASE)):
            group = np.flatnonzero((spans.proc == proc) & ((spans.request >= 0) == is_request))
            order = group[np.lexsort((-spans.end[group], spans.start[group]))]
            tids[order] = base + _pack(spans.start[order].tolist(), spans.end[order].tolist())
    return tids


def _pack(starts: list[int], ends: list[int]) -> np.ndarray:
    """Greedy: put each span (sorted by start, longest first) on the first track it nests in."""
    stacks: list[list[int]] = []
    track = np.empty(len(starts), np.int64)
    for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
        for t, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                track[k] = t
                break
        else:
            stacks.append([end])
            track[k] = len(stacks) - 1
    return track


def _metadata(trace: Trace, tids: np.ndarray) -> list[dict]:
    events = []
    for p in trace.processes:
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": p.index,
                "args": {"name": f"{p.role}: {p.name} (pid {p.pid}, {p.host})"},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": p.index,
                "args": {"sort_index": role_rank(p.role) * 10_000 + p.index},
            }
        )
        used = np.unique(np.r_[1, tids[trace.spans.proc == p.index]])
        for tid in used.tolist():
            name = f"requests {tid - _REQUEST_TID_BASE + 1}" if tid >= _REQUEST_TID_BASE else f"main {tid}"
            events.append({"ph": "M", "name": "thread_name", "pid": p.index, "tid": tid, "args": {"name": name}})
    return events


def _span_events(trace: Trace, tids: np.ndarray) -> list[dict]:
    spans = trace.spans
    starts_us, durs_us = (spans.start / 1000).tolist(), (spans.duration / 1000).tolist()
    procs, names, tid_list = spans.proc.tolist(), spans.name.tolist(), tids.tolist()
    events = []
    for i in range(len(spans)):
        args = trace.span_attrs(i)
        if spans.status[i] == STATUS_UNFINISHED:
            args["unfinished"] = True
        if i in spans.errors:
            args["error"] = spans.errors[i]
        events.append(
            {
                "ph": "X",
                "name": trace.names[names[i]],
                "pid": procs[i],
                "tid": tid_list[i],
                "ts": starts_us[i],
                "dur": durs_us[i],
                "args": args,
            }
        )
    return events


def _instant_events(trace: Trace, tids: np.ndarray) -> list[dict]:
    ev = trace.events
    events = []
    for i in range(len(ev)):
        parent = int(ev.parent[i])
        events.append(
            {
                "ph": "i",
                "s": "t",
                "name": trace.names[int(ev.name[i])],
                "pid": int(ev.proc[i]),
                "tid": int(tids[parent]) if parent >= 0 else 1,
                "ts": float(ev.time[i]) / 1000,
                "args": trace.event_attrs(i),
            }
        )
    return events
