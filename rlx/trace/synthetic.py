"""A synthetic trace of an RL run, for tests, the viewer benchmark and the docs screenshot.

It writes the same files the tracer writes (same record types and encoder) for a made-up run:
rollout servers with a bounded number of running requests (``queued`` then ``generate`` per
request), a controller trainer rank (``step`` > ``rollout``, ``reward``, ``logprob``,
``update.micro_batch``, ``optimizer_step``, ``sync`` > ``sync.pack``/``sync.transfer``,
``checkpoint``), a second trainer rank, and one weight receiver per rollout server (role
``sync``: ``sync.load``, ``sync.ack``). Durations are random but seeded. It is not a model of any
real run's timings; it exists to have many realistic-looking spans quickly.
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path

from rlx.trace.format import FORMAT_NAME, FORMAT_VERSION, NO_ATTRS, Begin, Complete, End, Header, Instant, encoder
from rlx.trace.tracer import OPEN_SPAN_FLUSH_S

_MS = 1_000_000
_START_WALL_NS = 1_750_000_000 * 1_000_000_000


class _ProcessWriter:
    """Collects one process's lines; times are given on the shared clock (ns since run start)."""

    def __init__(self, name: str, role: str, pid: int, start_ns: int) -> None:
        self.name, self.start_ns, self._next_id = name, start_ns, 1
        self._open: dict[int, tuple] = {}
        header = Header(
            format=FORMAT_NAME,
            version=FORMAT_VERSION,
            name=name,
            role=role,
            pid=pid,
            host="synthetic",
            wall_ns=_START_WALL_NS + start_ns,
            mono_ns=10**12 + start_ns,
        )
        self.lines = [encoder.encode(header)]

    def begin(self, name: str, t0: int, parent: int = 0, request=None, attrs=None) -> int:
        """A span whose end comes later (``end``); returns its id."""
        span_id, self._next_id = self._next_id, self._next_id + 1
        self._open[span_id] = (name, t0, parent, request, attrs)
        return span_id

    def end(self, span_id: int, t1: int, end_attrs=None, err=None) -> None:
        """Written as the tracer would: one complete line, or begin + end lines if it was long."""
        name, t0, parent, request, attrs = self._open.pop(span_id)
        if t1 - t0 < OPEN_SPAN_FLUSH_S * 1e9:
            merged = {**(attrs or {}), **(end_attrs or {})}
            self.lines.append(
                encoder.encode(
                    Complete(
                        i=span_id,
                        n=name,
                        t=t0 - self.start_ns,
                        d=t1 - t0,
                        p=parent,
                        r=request,
                        a=merged or NO_ATTRS,
                        err=err,
                    )
                )
            )
            return
        self.lines.append(
            encoder.encode(Begin(i=span_id, n=name, t=t0 - self.start_ns, p=parent, r=request, a=attrs or NO_ATTRS))
        )
        self.lines.append(encoder.encode(End(i=span_id, t=t1 - self.start_ns, a=end_attrs or NO_ATTRS, err=err)))

    def span(
        self, name: str, t0: int, t1: int, parent: int = 0, request=None, attrs=None, end_attrs=None, err=None
    ) -> int:
        span_id = self.begin(name, t0, parent, request, attrs)
        self.end(span_id, t1, end_attrs, err)
        return span_id

    def instant(self, name: str, t: int, parent: int = 0, request=None, attrs=None) -> None:
        self.lines.append(
            encoder.encode(Instant(n=name, t=t - self.start_ns, p=parent, r=request, a=attrs or NO_ATTRS))
        )

    def write(self, trace_dir: Path) -> Path:
        path = trace_dir / f"{self.name}.{1000 + len(self.name)}.jsonl"
        path.write_bytes(b"\n".join(self.lines) + b"\n")
        return path


class _Run:
    def __init__(self, trace_dir: Path, num_servers: int, requests_per_step: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.requests_per_step = requests_per_step
        self.servers = [_ProcessWriter(f"rollout{k}", "rollout", 2000 + k, k * _MS) for k in range(num_servers)]
        self.receivers = [
            _ProcessWriter(f"rollout{k}-worker", "sync", 3000 + k, k * _MS + 3 * _MS) for k in range(num_servers)
        ]
        self.trainers = [_ProcessWriter(f"trainer{k}", "trainer", 4000 + k, 5 * _MS) for k in range(2)]
        self.trace_dir = trace_dir
        self.num_entries = 0
        self.next_request = 0

    def step(self, step: int, t: int) -> int:
        lead = self.trainers[0]
        step_id = lead.begin("step", t, attrs={"step": step})
        t_gen = self.generate(t + 2 * _MS, lead, step_id)
        t_reward = t_gen + self.rng.randint(5, 20) * _MS
        lead.span("reward", t_gen, t_reward, step_id, attrs={"num_samples": self.requests_per_step})
        t_end = self.train(t_reward, step, step_id)
        t_end = self.sync(t_end, step, step_id)
        if step % 10 == 9:
            t_end = self.checkpoint(t_end, step, step_id)
        lead.end(step_id, t_end)
        return t_end + _MS

    def generate(self, t: int, lead: _ProcessWriter, step_id: int) -> int:
        per_server = self.requests_per_step // len(self.servers)
        done = max(self.serve(server, t, per_server) for server in self.servers)
        lead.span("rollout", t, done, step_id, attrs={"num_requests": per_server * len(self.servers)})
        return done

    def serve(self, server: _ProcessWriter, t: int, num_requests: int, max_running: int = 24) -> int:
        slots, done = [t] * max_running, t
        for _ in range(num_requests):
            rid, self.next_request = f"req-{self.next_request}", self.next_request + 1
            t_free = heapq.heappop(slots)
            t_arrive = t + self.rng.randint(0, 200_000)
            t_start = max(t_arrive, t_free)
            completion = self.rng.choice((4, 8, 8, 16, 32, 64, 256))
            t_done = t_start + completion * self.rng.randint(150_000, 400_000)
            server.span("queued", t_arrive, t_start, request=rid)
            finish = "length" if completion == 256 else "stop"
            server.span(
                "generate",
                t_start,
                t_done,
                request=rid,
                attrs={"prompt_tokens": self.rng.randint(20, 200)},
                end_attrs={"completion_tokens": completion, "finish_reason": finish},
            )
            if completion == 256:
                server.instant("max_tokens_reached", t_done, request=rid)
            heapq.heappush(slots, t_done)
            done = max(done, t_done)
            self.num_entries += 3 if completion == 256 else 2
        return done

    def train(self, t: int, step: int, step_id: int) -> int:
        t_end = t
        for rank, trainer in enumerate(self.trainers):
            parent = step_id if rank == 0 else trainer.begin("step", t, attrs={"step": step})
            t_r = t + self.rng.randint(30, 60) * _MS
            trainer.span("logprob", t, t_r, parent)
            for micro in range(4):
                t_next = t_r + self.rng.randint(40, 90) * _MS
                trainer.span("update.micro_batch", t_r, t_next, parent, attrs={"micro_batch": micro})
                t_r = t_next
            t_opt = t_r + self.rng.randint(5, 15) * _MS
            trainer.span("optimizer_step", t_r, t_opt, parent, end_attrs={"grad_norm": round(self.rng.random(), 3)})
            if rank:
                trainer.end(parent, t_opt)
            t_end = max(t_end, t_opt)
        return t_end

    def sync(self, t: int, step: int, step_id: int, num_buckets: int = 4) -> int:
        lead = self.trainers[0]
        sync_id = lead.begin("sync", t, step_id, attrs={"step": step})
        for bucket in range(num_buckets):
            attrs = {"bucket_id": bucket, "bytes": 64 << 20}
            t_pack = t + self.rng.randint(2, 6) * _MS
            lead.span("sync.pack", t, t_pack, sync_id, attrs=attrs)
            t_sent = t_pack + self.rng.randint(3, 8) * _MS
            lead.span("sync.transfer", t_pack, t_sent, sync_id, attrs=attrs)
            t = t_sent
            for receiver in self.receivers:
                t_load = t_sent + self.rng.randint(4, 10) * _MS
                receiver.span("sync.load", t_sent, t_load, attrs=attrs)
                receiver.span("sync.ack", t_load, t_load + 200_000, attrs=attrs)
                t = max(t, t_load + 200_000)
        lead.end(sync_id, t)
        return t

    def checkpoint(self, t: int, step: int, step_id: int) -> int:
        t_end = t + self.rng.randint(100, 300) * _MS
        self.trainers[0].span("checkpoint", t, t_end, step_id, attrs={"step": step})
        self.trainers[0].instant("checkpoint_saved", t_end, step_id, attrs={"path": f"ckpt/step_{step}"})
        return t_end

    def write(self) -> list[Path]:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        return [w.write(self.trace_dir) for w in self.servers + self.receivers + self.trainers]


def write_synthetic_trace(
    trace_dir: str | Path, num_entries: int = 10_000, num_servers: int = 2, requests_per_step: int = 256, seed: int = 0
) -> list[Path]:
    """Write a trace of at least ``num_entries`` spans plus events; returns the files written."""
    run = _Run(Path(trace_dir), num_servers, requests_per_step, seed)
    t, step = 10 * _MS, 0
    while run.num_entries < num_entries:
        t = run.step(step, t)
        step += 1
        run.num_entries += 20 + 10 * len(run.servers)
    return run.write()
