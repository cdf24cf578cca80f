"""SIGTERM mid-run with the Megatron backend at TP = 2 (two tensor-parallel gloo ranks on the CPU): every process
ends within seconds and nothing is left, the checkpoints left are whole, and `--resume` from the newest torch_dist
checkpoint continues to the uninterrupted run's rewards (within 0.05 per step on average). The quickstart's
settings on the session's tiny model; the same run on two GPUs is for a 2-GPU host."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from rlx.formats.checkpoint import list_checkpoints, verify_checkpoint
from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import assert_no_children_alive, read_metrics, wait_for

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
STEPS = 8
STOP_BOUND_S = 30.0
"""The longest the SIGTERM'd run may take to end every process."""


def args(model_dir: Path, run_dir: Path, steps: int) -> list[str]:
    return [
        "train",
        str(QUICKSTART),
        "trainer.backend=megatron",
        "trainer.num_ranks=2",
        "trainer.megatron.tensor_parallel=2",
        f"trainer.total_steps={steps}",
        "trainer.eval_every=0",
        "sync.verify=true",
        "checkpoint.every=2",
        "checkpoint.keep=4",
        f"model.path={model_dir}",
        f"trainer.output_dir={run_dir}",
    ]


def run(argv: list[str], log: Path) -> int:
    proc = start_rlx(argv, log)
    try:
        return proc.wait(timeout=400)
    finally:
        stop_group(proc)


def rewards(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["reward_mean"] for r in read_metrics(run_dir) if "reward_mean" in r}


def test_sigterm_at_tp2_ends_every_process_and_resume_matches_the_uninterrupted_run(
    tiny_model_dir, tmp_path, record_property
):
    whole = tmp_path / "whole"
    assert run(args(tiny_model_dir, whole, STEPS), tmp_path / "whole.log") == 0, (tmp_path / "whole.log").read_text()
    want = rewards(whole)
    assert sorted(want) == list(range(1, STEPS + 1))

    cut, log = tmp_path / "cut", tmp_path / "cut.log"
    proc = start_rlx(args(tiny_model_dir, cut, 200), log)  # constant lr: the length does not change a step
    try:
        wait_for(lambda: (cut / "metrics.jsonl").exists() and max(rewards(cut), default=0) >= 3, 300, proc, log)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        proc.wait(STOP_BOUND_S + 30)
        seconds = time.monotonic() - signalled
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert seconds < STOP_BOUND_S, f"{seconds:.1f} s to end after SIGTERM"
    assert_no_children_alive(cut)
    checkpoints = list_checkpoints(cut / "checkpoints")
    assert checkpoints, output[-3000:]
    for ckpt in checkpoints:  # whole (manifest last, every file as it says) or not there at all
        assert verify_checkpoint(ckpt)["backend"] == "megatron"
    last = int(checkpoints[-1].name.split("_")[1])
    assert last < STEPS, f"the run reached step {last} before the signal; nothing left to resume"

    resumed_log = tmp_path / "resume.log"
    assert run([*args(tiny_model_dir, cut, STEPS), "--resume"], resumed_log) == 0, resumed_log.read_text()[-3000:]
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    after = [r for r in rows if "reward_mean" in r][-(STEPS - last) :]
    assert [r["step"] for r in after] == list(range(last + 1, STEPS + 1))
    assert all(r["sync_verified"] == 1.0 for r in after)
    gap = sum(abs(r["reward_mean"] - want[r["step"]]) for r in after) / len(after)
    record_property("seconds_to_end", round(seconds, 2))
    record_property("resumed_from", last)
    record_property("mean_abs_reward_gap", round(gap, 4))
    assert gap <= 0.05, (gap, {r["step"]: (r["reward_mean"], want[r["step"]]) for r in after})
