"""placement.mode=colocated end to end on a CPU: `rlx train` with the hf backend for two steps. The trace
shows the turns in order (engine sleep -> train -> engine wakes its weights -> verified sync -> trainer offload
-> engine wakes its KV cache -> generate) and the metrics carry each phase's memory peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launch.test_train import (
    assert_no_children_alive,
    read_metrics,
    run_to_end,
    small_config,
)

pytestmark = pytest.mark.slow


def spans(trace_dir: Path, process: str) -> list[dict]:
    """The finished spans of one process, in start order. A span still open a second after it began is written
    as a begin and an end line (``rlx.trace.format``): the pair makes one span, the end's attributes over the
    begin's (a first generation slowed by a busy machine came that way and was missed)."""
    path = next(trace_dir.glob(f"{process}.*.jsonl"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    done = [r for r in records if r.get("k") == "X"]
    begins = {r["i"]: r for r in records if r.get("k") == "B"}
    for end in (r for r in records if r.get("k") == "E" and r["i"] in begins):
        begin = begins[end["i"]]
        done.append({**begin, "k": "X", "d": end["t"] - begin["t"], "a": {**begin.get("a", {}), **end.get("a", {})}})
    return sorted(done, key=lambda r: r["t"])


def test_colocated_run_takes_turns_and_syncs_verified(tiny_model_dir, tmp_path):
    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        trace={"enabled": True},
        placement={"mode": "colocated", "offload": True},  # unset, a CPU run's trainer has nothing to move
        checkpoint={"save_final": False},
    )
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=2", "trainer.eval_every=0", "sync.verify=true")
    assert code == 0, output[-4000:]
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for phase in ("generate", "train", "sync"):
            assert row[f"mem_peak_{phase}_gb"] == 0.0 and row[f"mem_engine_peak_{phase}_gb"] == 0.0  # CPU host
        assert row["logprob_diff_mean"] < 0.05  # the engine generated with the weights the trainer holds

    server = [
        (s["n"], s.get("a", {}))
        for s in spans(run_dir / "trace", "rollout0")
        if s["n"] in ("engine.sleep", "engine.wake_up", "sync.load", "generate")
    ]
    order = []
    for name, attrs in server:  # collapse the runs of generate / sync.load spans into one entry each
        entry = f"{name}:{attrs['asleep']}" if name.startswith("engine.") else name
        if not order or order[-1] != entry:
            order.append(entry)
    one_step = ["generate", "engine.sleep:kv_cache,weights", "engine.wake_up:kv_cache", "sync.load", "engine.wake_up:"]
    assert order == one_step * 2

    trainer = [
        s["n"]
        for s in spans(run_dir / "trace", "trainer0")
        if s["n"].startswith("colocate.") or s["n"] in ("sync", "update.micro_batch")
    ]
    trainer = [n for i, n in enumerate(trainer) if i == 0 or trainer[i - 1] != n]
    turn = [
        "colocate.engine_sleep",
        "colocate.onload",
        "update.micro_batch",
        "colocate.engine_wake",
        "sync",
        "colocate.offload",
        "colocate.engine_wake",
    ]
    assert trainer == ["colocate.offload"] + turn * 2
    assert_no_children_alive(run_dir)
