"""Tracing overhead and trace-viewer opening time, each against a baseline measured in the same run.

1. Cost per call: a span (two attributes) and an instant event with the tracer on (writing its
   file) and off, against an empty ``with`` block and an empty function call (the floor).
2. A rollout-shaped asyncio workload (requests queued behind a concurrency limit, a ``queued``
   event, a ``generate`` span around per-token work, a ``reward`` span): requests/s with tracing
   off and on, rounds interleaved, median; the slowdown is the number the tracer must keep
   under 2%. Per-token work is a busy loop of ``--token-us`` (default 300 us: about one tiny-model
   token's share of a CPU rollout step in the quickstart; lower is harsher on the tracer).
3. Opening a trace of ``--events`` spans + events with ``rlx trace-view``, as a user does: the real
   command in a fresh process on a pseudo-terminal (160x48), timed from the moment the process
   is spawned (interpreter start and every import included) to the moment its first frame with
   the timeline and the status bar has been written to the terminal. Twice per round: a first
   open (the trace cache emptied: parse, and the cache written in the background) and a re-open
   (read from the cache, ``rlx/trace/cache.py``). Beside them, a breakdown of a first open in
   a fresh process (imports, load, first frame of the headless app, peak memory), and the floor
   of any Python JSON reader: reading the same bytes and decoding them into plain Python objects
   with msgspec. Rounds alternate the four, medians reported. The trace is a real run's trace
   repeated up to ``--events`` (``--from-trace DIR``, ``rlx/trace/replicate.py``), or else a
   synthetic one (``rlx/trace/synthetic.py``), whose mix of records is not a real run's: it has
   few instant events and long spans, which a real rollout server writes for every request.
   The trace files are in the page cache (the replicated trace was just written).

    python benchmarks/bench_trace.py [--json OUT.json] [--events 1000000] [--parts calls,rollout,viewer]
                                     [--from-trace RUN_DIR/trace]

Prints rich tables; ``--json`` writes every number. Timings depend on the machine and its load:
the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlx.trace.tracer import Tracer  # noqa: E402


class _Empty:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _noop(name, **attrs):
    return None


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - start) / n


def span_loop(tracer_or_none):
    def run(n: int) -> None:
        for i in range(n):
            with (
                tracer_or_none.span("generate", request_id=i, prompt_tokens=7)
                if tracer_or_none is not None
                else _Empty()
            ):
                pass

    return run


def event_loop(event):
    def run(n: int) -> None:
        for i in range(n):
            event("queued", request_id=i, paused=False)

    return run


def measure_calls(n: int, repeats: int, trace_dir: Path) -> dict:
    on, off = Tracer(), Tracer()
    on.configure(trace_dir, role="bench", name="calls")
    cases = {
        "empty with-block (baseline)": span_loop(None),
        "span, tracing off": span_loop(off),
        "span, tracing on": span_loop(on),
        "empty call (baseline)": event_loop(_noop),
        "event, tracing off": event_loop(off.event),
        "event, tracing on": event_loop(on.event),
    }
    samples = {name: [] for name in cases}
    for _ in range(repeats):  # interleaved, so drift and load hit every case alike
        for name, fn in cases.items():
            samples[name].append(per_call_ns(fn, n))
    on.close()
    return {name: statistics.median(values) for name, values in samples.items()}


async def rollout_round(tracer: Tracer, requests: int, tokens: int, token_ns: int, concurrency: int) -> float:
    limit = asyncio.Semaphore(concurrency)

    def work() -> None:
        end = time.perf_counter_ns() + token_ns
        while time.perf_counter_ns() < end:
            pass

    async def one(i: int) -> None:
        rid = f"req-{i}"
        tracer.event("queued", request_id=rid)
        async with limit:
            with tracer.span("generate", request_id=rid, prompt_tokens=20) as span:
                for _ in range(tokens):
                    work()
                    await asyncio.sleep(0)
                span.set(completion_tokens=tokens, finish_reason="stop")
        with tracer.span("reward", request_id=rid):
            work()

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return requests / (time.perf_counter() - start)


def measure_rollout(args, trace_dir: Path) -> dict:
    on, off = Tracer(), Tracer()
    on.configure(trace_dir, role="rollout", name="bench-rollout")
    rates = {"tracing off": [], "tracing on": []}
    shape = (args.requests, args.tokens, int(args.token_us * 1000), args.concurrency)
    asyncio.run(rollout_round(off, *shape))  # warm-up
    for _ in range(args.repeats):
        rates["tracing off"].append(asyncio.run(rollout_round(off, *shape)))
        rates["tracing on"].append(asyncio.run(rollout_round(on, *shape)))
    on.close()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "requests_per_s": medians,
        "rounds": rates,
        "slowdown_pct": 100 * (1 - medians["tracing on"] / medians["tracing off"]),
        "lines_per_request": 3,
        "shape": dict(zip(("requests", "tokens", "token_ns", "concurrency"), shape, strict=True)),
    }


def viewer_probe(trace_dir: str, spawned_at: float) -> None:
    """Run in a fresh process (trace cache off): where the time of a first open goes."""
    wall0, cpu0 = time.monotonic(), time.process_time()
    from rlx.cli.trace_view import prefetch_viewer  # what `rlx trace-view` does, in its order
    from rlx.trace.loader import load_trace

    prefetch = prefetch_viewer()  # Textual is imported while the trace loads
    wall1, cpu1 = time.monotonic(), time.process_time()
    trace = load_trace(trace_dir)
    wall2, cpu2 = time.monotonic(), time.process_time()
    prefetch.join()
    wall3 = time.monotonic()
    from rlx.trace.viewer import TraceViewerApp

    app = TraceViewerApp(trace, trace_dir, started_at=time.perf_counter() - (time.monotonic() - spawned_at))

    async def first_frame() -> None:
        async with app.run_test(size=(160, 48)):
            while app.first_frame_s is None:
                await asyncio.sleep(0.005)

    asyncio.run(first_frame())
    print(
        json.dumps(
            {
                "interpreter_s": wall0 - spawned_at,
                "imports_s": wall1 - wall0,
                "load_s": wall2 - wall1,
                "load_cpu_s": cpu2 - cpu1,
                "viewer_import_wait_s": wall3 - wall2,
                "first_frame_s": app.first_frame_s,
                "cpu_to_first_frame_s": time.process_time() - cpu0,
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "spans": len(trace.spans),
                "events": len(trace.events),
                "skipped": trace.num_skipped,
            }
        )
    )


def terminal_open(
    trace_dir: Path,
    cache_dir: Path,
    size: tuple[int, int] = (160, 48),
    timeout_s: float = 120,
    rlx: list[str] | None = None,
    cwd: Path = ROOT,
) -> tuple[float, float]:
    """Seconds from spawning ``rlx trace-view TRACE`` on a pseudo-terminal to its first frame on it,
    and the CPU seconds the viewer had used by then (all its threads: less sensitive to the
    machine's load than the wall time).

    The first frame is the first output holding both the timeline's ruler (``window``) and the
    status bar's count of events: Textual writes a whole frame at once. Then ``q`` quits the viewer
    (its process group is killed if it does not exit). ``rlx`` replaces the command (e.g. another
    checkout's ``python -m rlx``, run in ``cwd``)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    env = dict(os.environ, TERM="xterm-256color", RLX_TRACE_CACHE=str(cache_dir))
    env.pop("COLUMNS", None), env.pop("LINES", None)
    script = Path(sys.executable).with_name("rlx")  # the installed command, else the package's __main__
    rlx = rlx or ([str(script)] if script.exists() else [sys.executable, "-m", "rlx"])
    command = [*rlx, "trace-view", str(trace_dir)]
    start = time.monotonic()
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True)
    os.close(slave)
    seen, first = b"", None
    try:
        while first is None and time.monotonic() - start < timeout_s:
            chunk = _read_pty(master, 0.5)
            if chunk is None:
                break
            seen = seen[-(1 << 20) :] + chunk
            if b"window" in seen and b" events" in seen:
                first = time.monotonic() - start
                cpu = _cpu_s(proc.pid)
        os.write(master, b"q")
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if _read_pty(master, 0.2) is None:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    if first is None:
        raise RuntimeError(f"rlx trace-view {trace_dir} drew no frame in {timeout_s:.0f} s; it wrote: {seen[-2000:]!r}")
    return first, cpu


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read_pty(master: int, wait_s: float) -> bytes | None:
    """What the terminal received in ``wait_s`` (b"" if nothing), or None once the program closed it."""
    ready, _, _ = select.select([master], [], [], wait_s)
    if not ready:
        return b""
    try:
        return os.read(master, 1 << 16) or None
    except OSError:  # EIO: every writer closed the terminal
        return None


def baseline_probe(trace_dir: str) -> None:
    """Run in a fresh process: read every line and decode it into plain Python objects."""
    import msgspec

    wall0, cpu0 = time.perf_counter(), time.process_time()
    count = 0
    for path in sorted(Path(trace_dir).glob("*.jsonl")):
        data = path.read_bytes()
        count += len(msgspec.json.decode(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]"))
    print(
        json.dumps(
            {
                "decode_s": time.perf_counter() - wall0,
                "decode_cpu_s": time.process_time() - cpu0,
                "lines": count,
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def probe(kind: str, trace_dir: Path, cache_dir: Path) -> dict:
    env = dict(os.environ, RLX_TRACE_CACHE=str(cache_dir) if kind == "viewer-cached" else "off")
    spawned_at = time.monotonic()
    out = subprocess.run(
        [sys.executable, __file__, f"--{kind}-probe", str(trace_dir), "--spawned-at", str(spawned_at)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_viewer(args, work: Path) -> dict:
    from rlx.trace.replicate import replicate_trace
    from rlx.trace.synthetic import write_synthetic_trace

    trace_dir, cache_dir = work / "viewer", work / "trace-cache"
    if args.from_trace:
        files = replicate_trace(args.from_trace, trace_dir, args.events)
    else:
        files = write_synthetic_trace(trace_dir, num_entries=args.events, num_servers=4, requests_per_step=1024)
    rounds = []
    for _ in range(args.viewer_repeats):  # interleaved, so that load drift hits every case alike
        baseline, breakdown = probe("baseline", trace_dir, cache_dir), probe("viewer", trace_dir, cache_dir)
        shutil.rmtree(cache_dir, ignore_errors=True)
        (first, first_cpu), (again, again_cpu) = (
            terminal_open(trace_dir, cache_dir),
            terminal_open(trace_dir, cache_dir),
        )
        rounds.append(
            {
                "baseline": baseline,
                "breakdown": breakdown,
                "first_open_s": first,
                "reopen_s": again,
                "first_open_cpu_s": first_cpu,
                "reopen_cpu_s": again_cpu,
            }
        )
    median = statistics.median
    pick = sorted(rounds, key=lambda r: r["breakdown"]["first_frame_s"])[len(rounds) // 2]  # the median breakdown
    return {
        "bytes": sum(f.stat().st_size for f in files),
        "baseline": pick["baseline"],
        "viewer": pick["breakdown"],
        "source": f"{args.from_trace} repeated" if args.from_trace else "synthetic",
        "first_open_s": median(r["first_open_s"] for r in rounds),
        "reopen_s": median(r["reopen_s"] for r in rounds),
        "first_open_cpu_s": median(r["first_open_cpu_s"] for r in rounds),
        "reopen_cpu_s": median(r["reopen_cpu_s"] for r in rounds),
        "first_open_s_all": [r["first_open_s"] for r in rounds],
        "reopen_s_all": [r["reopen_s"] for r in rounds],
        "first_frame_s_all": [r["breakdown"]["first_frame_s"] for r in rounds],
        "cache_bytes": sum(f.stat().st_size for f in cache_dir.glob("*.rlxtc")),
        "terminal": "160x48 pseudo-terminal, TERM=xterm-256color",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--token-us", type=float, default=300.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--events", type=int, default=1_000_000, help="spans + events of the trace the viewer opens")
    parser.add_argument(
        "--from-trace",
        help="repeat this real trace (a run's trace dir) up to --events, instead of writing a synthetic one",
    )
    parser.add_argument("--viewer-repeats", type=int, default=3)
    parser.add_argument("--parts", default="calls,rollout,viewer", help="which measurements, comma-separated")
    parser.add_argument("--viewer-probe", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-probe", help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewer_probe:
        return viewer_probe(args.viewer_probe, args.spawned_at)
    if args.baseline_probe:
        return baseline_probe(args.baseline_probe)
    with tempfile.TemporaryDirectory(prefix="rlx-bench-trace-") as tmp:
        work = Path(tmp)
        parts = set(args.parts.split(","))
        result = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}
        if "calls" in parts:
            result["calls_ns"] = measure_calls(args.calls, args.repeats, work / "calls")
        if "rollout" in parts:
            result["rollout"] = measure_rollout(args, work / "rollout")
        if "viewer" in parts:
            result["viewer"] = measure_viewer(args, work)
    result["load_average_after"] = os.getloadavg()
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def report(result: dict) -> None:
    from rich.console import Console

    console = Console(width=120)
    if "calls_ns" in result:
        report_calls(console, result)
    if "rollout" in result:
        report_rollout(console, result)
    if "viewer" in result:
        report_viewer(console, result)
    console.print(
        f"load average before/after: {result['load_average']} / {result['load_average_after']}, {result['cpus']} CPUs"
    )


def report_calls(console, result: dict) -> None:
    from rich.table import Table

    calls = Table(title="cost per call (median of interleaved repeats)")
    calls.add_column("call")
    calls.add_column("ns", justify="right")
    for name, ns in result["calls_ns"].items():
        calls.add_row(name, f"{ns:,.0f}")
    console.print(calls)


def report_rollout(console, result: dict) -> None:
    from rich.table import Table

    r = result["rollout"]
    rollout = Table(
        title=f"rollout-shaped workload: {r['shape']['requests']} requests x {r['shape']['tokens']} tokens "
        f"x {r['shape']['token_ns'] / 1000:.0f} us, {r['shape']['concurrency']} at once"
    )
    for column in ("tracing", "requests/s (median)", "rounds"):
        rollout.add_column(column, justify="left" if column == "tracing" else "right")
    for name, rate in r["requests_per_s"].items():
        rollout.add_row(name, f"{rate:,.1f}", " ".join(f"{v:,.0f}" for v in r["rounds"][name]))
    rollout.caption = f"slowdown with tracing on: {r['slowdown_pct']:.2f}% (target < 2%)"
    console.print(rollout)


def report_viewer(console, result: dict) -> None:
    from rich.table import Table

    v = result["viewer"]
    runs = len(v["first_open_s_all"])
    opened = Table(
        title=f"rlx trace-view on {v['viewer']['spans']:,} spans + {v['viewer']['events']:,} events "
        f"({v['bytes'] / 1e6:.0f} MB, {v['source']}): process spawn to first frame on a "
        f"{v['terminal']} (median of {runs} alternating rounds)"
    )
    for column in ("open", "first frame s", "cpu s by then", "all rounds s"):
        opened.add_column(column, justify="left" if column == "open" else "right")
    opened.add_row(
        "[b]first open[/] (parse; cache written in the background)",
        f"[b]{v['first_open_s']:.2f}[/]",
        f"{v['first_open_cpu_s']:.2f}",
        ", ".join(f"{s:.2f}" for s in v["first_open_s_all"]),
    )
    opened.add_row(
        "[b]re-open[/] (columns read from the trace cache)",
        f"[b]{v['reopen_s']:.2f}[/]",
        f"{v['reopen_cpu_s']:.2f}",
        ", ".join(f"{s:.2f}" for s in v["reopen_s_all"]),
    )
    opened.caption = f"target < 1.5 s; trace cache {v['cache_bytes'] / 1e6:.0f} MB"
    console.print(opened)

    parts = Table(title="where a first open goes: a fresh process, headless app, trace cache off (median round)")
    for column in ("step", "wall s", "cpu s", "peak RSS MiB"):
        parts.add_column(column, justify="left" if column == "step" else "right")
    b, w = v["baseline"], v["viewer"]
    parts.add_row(
        "floor: read + msgspec decode to plain objects",
        f"{b['decode_s']:.2f}",
        f"{b['decode_cpu_s']:.2f}",
        f"{b['max_rss_mib']:.0f}",
    )
    parts.add_row("interpreter start", f"{w['interpreter_s']:.2f}", "", "")
    parts.add_row("imports (rlx.cli, numpy, rlx.trace)", f"{w['imports_s']:.2f}", "", "")
    parts.add_row(
        "load into columns (pyarrow imported; Textual meanwhile)", f"{w['load_s']:.2f}", f"{w['load_cpu_s']:.2f}", ""
    )
    parts.add_row("wait for the Textual import after the load", f"{w['viewer_import_wait_s']:.2f}", "", "")
    parts.add_row(
        "[b]spawn to first frame (headless)[/]",
        f"[b]{w['first_frame_s']:.2f}[/]",
        f"{w['cpu_to_first_frame_s']:.2f}",
        f"{w['max_rss_mib']:.0f}",
    )
    parts.caption = f"all rounds: {', '.join(f'{s:.2f}' for s in v['first_frame_s_all'])} s"
    console.print(parts)


if __name__ == "__main__":
    main()
