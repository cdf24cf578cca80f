"""What `rlx train` says when a run ends, in every mode: the closing line names the trace viewer only for a run
that recorded a trace and takes held-out accuracy from the run's metrics (a resumed run's too); a stopped run
names the checkpoint it leaves and the command that resumes it; --resume of a finished run trains nothing and
says how to train further; a run stopped between a checkpoint and its metrics line gets the line back."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from rlx.config import load_config
from rlx.launch.closing import done_line
from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import read_metrics, run_to_end, small_config, wait_for

pytestmark = pytest.mark.slow


def one_line(output: str) -> str:
    return " ".join(output.split())


def test_closing_lines_of_a_run_resumed_twice(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"every": 1, "keep": 3}, trainer={"eval_every": 1})
    run_dir = tmp_path / "run"
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=2")
    assert code == 0, output[-4000:]
    evals = {r["step"]: r["eval_accuracy"] for r in read_metrics(run_dir)}
    text = one_line(output)
    assert f"held-out accuracy {evals[0]:.3f} at step 0 -> {evals[2]:.3f} at step 2" in text, text[-2000:]
    assert "no trace recorded (trace.enabled=true records one" in text and "`rlx trace-view " not in text
    assert f"run directory {run_dir}: config.yaml, metrics.jsonl, checkpoints/, logs/train.log" in text
    # a log, not a terminal: neither transformers' loading bars nor the last frame of the progress bar
    assert "Loading weights" not in text and "━" not in text and "step 2 reward=" in text

    # stopped after step 2's checkpoint, before its metrics line: --resume writes the line from the checkpoint
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=3", "--resume")
    assert code == 0, output[-4000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["eval_accuracy"] == pytest.approx(evals[2]) and "grad_norm" in rows[2]
    text = one_line(output)
    assert f"held-out accuracy {evals[0]:.3f} at step 0 -> {rows[3]['eval_accuracy']:.3f} at step 3" in text, text
    assert "trainer.eval_every=0" not in text

    code, output = run_to_end(config, tmp_path, "trainer.total_steps=3", "--resume")
    assert code == 0, output[-4000:]
    text = one_line(output)
    assert f"{run_dir} is already at step 3 (trainer.total_steps=3): nothing to train" in text, text
    assert "raise trainer.total_steps (e.g. trainer.total_steps=6)" in text
    assert "rollout servers ready" not in text and len(read_metrics(run_dir)) == 4


def test_ctrl_c_names_the_checkpoint_left_and_the_resume_command(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"every": 1, "keep": 2})
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), "trainer.total_steps=2000", "trainer.eval_every=0"], log)
    try:
        wait_for(
            lambda: any((c / "manifest.json").exists() for c in (run_dir / "checkpoints").glob("step_*")),
            300,
            proc,
            log,
        )
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        stop_group(proc)
    text = one_line(log.read_text())
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted: stopping every child process; the newest complete checkpoint is" in text, text[-3000:]
    assert f"`rlx train {config} trainer.total_steps=2000 trainer.eval_every=0 --resume` continues from it" in text


def test_an_external_task_says_it_has_no_held_out_problems(tmp_path):
    """task.name=external evaluates nothing (its episodes come from an agent): the line says why, not that
    trainer.eval_every is 0."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_accuracy": None}) + "\n")
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    cfg = load_config(str(config), ["task.name=external", "rollout.n=1", "algorithm.advantage=reinforce_pp"])
    line = done_line(cfg, run_dir, [(0, float("nan"))])
    assert "no held-out accuracy (task.name=external" in line and "eval_every" not in line
    assert "`rlx trace-view " in line  # the quickstart records a trace
