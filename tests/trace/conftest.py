"""Fixtures: small traces written by the real tracer (several "processes" as Tracer objects)."""

from __future__ import annotations

import asyncio

import pytest

from rlx.trace.tracer import Tracer


def write_small_run(trace_dir, num_requests: int = 6) -> None:
    """A rollout server answering requests concurrently and a trainer stepping, both real tracers."""
    rollout, trainer = Tracer(), Tracer()
    rollout.configure(trace_dir, role="rollout", name="rollout0")
    trainer.configure(trace_dir, role="trainer", name="trainer0")

    async def request(step: int, i: int) -> None:
        with rollout.span("queued", request_id=f"req-{step}-{i}"):
            await asyncio.sleep(0.001 * (i % 3))
        with rollout.span("generate", request_id=f"req-{step}-{i}", prompt_tokens=10 + i) as span:
            await asyncio.sleep(0.002)
            rollout.event("token_budget_checked", budget=8)
            span.set(completion_tokens=5 + i, finish_reason="length" if i == 0 else "stop")

    async def serve(step: int) -> None:
        await asyncio.gather(*(request(step, i) for i in range(num_requests)))

    for step in range(2):
        with trainer.span("step", step=step):
            with trainer.span("rollout"):
                asyncio.run(serve(step))
            with trainer.span("reward"):
                pass
            for micro in range(2):
                with trainer.span("update.micro_batch", micro_batch=micro):
                    pass
            with trainer.span("optimizer_step"):
                pass
            try:
                with trainer.span("checkpoint", step=step):
                    if step == 1:
                        raise OSError("disk full")
            except OSError:
                pass
    rollout.close()
    trainer.close()


@pytest.fixture
def small_trace(tmp_path):
    trace_dir = tmp_path / "run" / "trace"
    write_small_run(trace_dir)
    return trace_dir


@pytest.fixture(autouse=True)
def no_trace_cache(monkeypatch):
    """Tests load traces as parsed, never from (or into) the user's trace cache; the cache's own
    tests point RLX_TRACE_CACHE at a temporary directory."""
    monkeypatch.setenv("RLX_TRACE_CACHE", "off")
