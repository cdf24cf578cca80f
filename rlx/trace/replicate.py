"""A large trace made from a real one: a recorded run's lines repeated back to back.

The viewer's speed depends on what a trace holds (how many instant events, long spans written
as begin + end lines, distinct request ids, attributes), and a made-up trace
(``synthetic.py``) holds a different mix than a real run. ``replicate_trace`` copies every file
of a real trace directory ``copies`` times, each copy shifted after the previous one on the
shared clock, with span ids, parent ids and request ids made distinct per copy, so that a
six-step quickstart trace becomes a million-entry trace with the quickstart's mix. Used by
``benchmarks/bench_trace.py --from-trace``; it reads and writes whole files (a benchmark input,
not a user's trace).
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from rlx.trace.loader import find_trace_files

_GAP_NS = 1_000_000


def count_entries(lines: list[dict]) -> int:
    """Spans + instant events of a file's records (a begin and its end are one span)."""
    return sum(1 for line in lines if line.get("k") in ("X", "B", "I"))


def replicate_trace(source: str | Path, out_dir: str | Path, num_entries: int) -> list[Path]:
    """Write at least ``num_entries`` spans + events into ``out_dir``, repeating ``source``."""
    files = find_trace_files(source)
    bodies = {f: [msgspec.json.decode(line) for line in f.read_bytes().splitlines() if line.strip()] for f in files}
    per_copy = sum(count_entries(lines[1:]) for lines in bodies.values())
    if per_copy == 0:
        raise ValueError(f"{source} holds no spans or events to repeat; record a run with trace.enabled=true")
    copies = max(1, math.ceil(num_entries / per_copy))
    period = _period(bodies.values())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path, lines in bodies.items():
        out = out_dir / path.name
        out.write_bytes(_repeat(lines, copies, period))
        written.append(out)
    return written


def _period(bodies) -> int:
    """The run's length on the shared clock, plus a gap: how far each copy is shifted."""
    starts, ends = [], []
    for header, *body in bodies:
        times = [line["t"] + line.get("d", 0) for line in body if "t" in line]
        if times:
            starts.append(header["wall_ns"] + min(line["t"] for line in body if "t" in line))
            ends.append(header["wall_ns"] + max(times))
    return (max(ends) - min(starts) if ends else 0) + _GAP_NS


def _repeat(lines: list[dict], copies: int, period: int) -> bytes:
    header, body = lines[0], lines[1:]
    id_step = max((line.get("i", 0) for line in body), default=0) + 1
    encode = msgspec.json.encode
    out = [encode(header)]
    for copy in range(copies):
        for line in body:
            out.append(encode(_shifted(line, copy, copy * period, copy * id_step)))
    return b"\n".join(out) + b"\n"


def _shifted(line: dict, copy: int, dt: int, di: int) -> dict:
    if copy == 0:
        return line
    line = dict(line)
    if "t" in line:
        line["t"] += dt
    if "i" in line:
        line["i"] += di
    if line.get("p"):
        line["p"] += di
    request = line.get("r")
    if isinstance(request, str):
        line["r"] = f"{request}.{copy}"
    elif isinstance(request, int):
        line["r"] = request + copy * 1_000_000_000
    return line
