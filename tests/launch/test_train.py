"""`rlx train` end to end: real launcher, real rollout server processes, real trainer."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.formats.checkpoint import list_checkpoints, verify_checkpoint
from rlx.net import engine_socket_dir
from tests.helpers import group_alive, start_rlx, stop_group, write_config

pytestmark = pytest.mark.slow

SMALL = {
    "task": {"max_operand": 9, "num_eval": 16},
    "rollout": {"n": 4, "max_tokens": 4},
    "trainer": {"prompts_per_step": 4, "micro_batch_size": 8, "lr": 1e-4, "eval_every": 2},
}


def small_config(tmp_path: Path, model_dir: Path, backend: str, **extra) -> Path:
    sections = {k: dict(v) for k, v in SMALL.items()}
    sections["rollout"]["backend"] = backend
    sections["trainer"]["output_dir"] = str(tmp_path / "run")
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    return write_config(tmp_path / "run.yaml", model_dir, **sections)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def child_pids(run_dir: Path) -> dict[str, int]:
    path = run_dir / "logs" / "pids.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_for(predicate, timeout_s: float, proc=None, log: Path | None = None):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"run exited early ({proc.returncode}):\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out; log:\n{log.read_text()[-4000:] if log else ''}")


def assert_no_children_alive(run_dir: Path, timeout_s: float = 20.0) -> None:
    pids = child_pids(run_dir)
    assert pids, "the launcher recorded no children"
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(group_alive(pgid) for pgid in pids.values()):
        time.sleep(0.5)
    alive = {name: pgid for name, pgid in pids.items() if group_alive(pgid)}
    assert not alive, f"orphaned process groups: {alive}"


def run_to_end(config: Path, tmp_path: Path, *args: str, timeout_s: float = 400.0):
    log = tmp_path / f"train-{time.time_ns()}.log"
    proc = start_rlx(["train", str(config), *args], log)
    try:
        proc.wait(timeout_s)
    finally:
        stop_group(proc)
    return proc.returncode, log.read_text()


def test_two_step_one_step_off_run_with_vllm(tiny_model_dir, tmp_path):
    """A whole run on a vLLM server, in one_step_off (generation overlaps the update, weights synced between);
    sync mode's steps on vLLM are checked by tests/launch/test_faults.py's killed-server run. The engine starts with
    placeholder weights (rollout.engine_weights=first_sync): its step-0 evaluation and step 1's samples come from
    the trainer's weights, which the first sync loaded."""
    mode = "one_step_off"
    config = small_config(tmp_path, tiny_model_dir, "vllm", trace={"enabled": True}, checkpoint={"every": 1, "keep": 1})
    args = (f"trainer.mode={mode}", "trainer.total_steps=2", "sync.verify=true", "rollout.engine_weights=first_sync")
    code, output = run_to_end(config, tmp_path, *args)
    assert code == 0, output[-4000:]
    assert "placeholder weights (rollout.engine_weights=first_sync)" in (tmp_path / "run/logs/rollout0.log").read_text()
    assert "leaked shared_memory" not in output  # the resource tracker's warning about vLLM's queues
    assert f"`rlx trace-view {tmp_path / 'run' / 'trace'}` shows the timeline" in " ".join(output.split())
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        for key in (
            "reward_mean",
            "accuracy",
            "response_len_mean",
            "entropy",
            "grad_norm",
            "lr",
            "clip_frac",
            "logprob_diff_mean",
            "logprob_k3",
            "tokens_per_s",
            "time_generate",
            "time_update",
            "time_sync",
        ):
            assert key in row, key
        assert row["time_train"] >= row["time_update"] + row["time_logprob"]  # the whole call around them
        assert row["time_step"] >= row["time_collect"] + row["time_train"] + row["time_sync"]
        assert row["logprob_diff_mean"] < 0.05  # rollout engine and trainer agree (same weights each step)
        assert row["sync_zero_copy"] == 1.0  # one CPU rank: vLLM copied the weights straight out of the trainer's
    assert rows[1]["logprob_diff_mean"] < 1e-4  # sampled from the synced weights: a float32 engine agrees exactly
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2]
    assert rows[0]["time_eval"] > 0 and rows[2]["time_step"] > rows[2]["time_eval"] > 0  # a step holds its eval
    assert rows[1].get("is_weight_mean") is not None
    checkpoints = list_checkpoints(run_dir / "checkpoints")
    assert [c.name for c in checkpoints] == ["step_00000002"]  # keep=1 pruned step 1
    verify_checkpoint(checkpoints[0])
    traces = list((run_dir / "trace").glob("*.jsonl"))
    assert {t.name.split(".")[0] for t in traces} >= {"trainer0", "rollout0"}
    assert_no_children_alive(run_dir)
    assert not engine_socket_dir(child_pids(run_dir)["rollout0"]).exists()  # the server removed its engine's sockets


def test_resume_after_kill_continues_at_the_right_step(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"every": 1, "keep": 3})
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    # Far more steps than the kill lets it reach, so the kill always lands mid-run however fast steps are
    # (a step can take 0.1 s, so keep=3 may prune step 2 between two polls: any later one will do).
    proc = start_rlx(["train", str(config), "trainer.total_steps=2000", "trainer.eval_every=0"], log)

    def checkpointed_step_2_or_later() -> bool:
        ckpts = list_checkpoints(run_dir / "checkpoints")
        steps = [
            int(c.name.split("_")[1])
            for c in ckpts
            if c.name.split("_")[1].isdigit() and (c / "manifest.json").exists()
        ]
        return any(step >= 2 for step in steps)

    try:
        wait_for(checkpointed_step_2_or_later, 300, proc, log)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up at all: children must still go (parent-death signal)
        proc.wait(10)
    finally:
        stop_group(proc)
    assert_no_children_alive(run_dir)
    complete = [c for c in list_checkpoints(run_dir / "checkpoints") if (c / "manifest.json").exists()]
    last_good = max(int(c.name.split("_")[1]) for c in complete)
    assert 2 <= last_good < 2000
    partial = run_dir / "checkpoints" / "step_00000999"
    partial.mkdir()  # a torn, manifest-less checkpoint newer than the good ones must be skipped
    total = last_good + 2
    code, output = run_to_end(
        config,
        tmp_path,
        f"trainer.total_steps={total}",
        "trainer.eval_every=0",
        "checkpoint.export_hf=true",
        "--resume",
    )
    assert code == 0, output[-4000:]
    assert "skipping checkpoint" in output and "step_00000999" in output
    assert f"exported the final checkpoint to {run_dir / 'hf'}" in " ".join(output.split())  # the console wraps it
    from safetensors.torch import load_file

    exported = load_file(run_dir / "hf" / "model.safetensors")  # the newest checkpoint's weights, tensor for tensor
    final = load_file(run_dir / "checkpoints" / f"step_{total:08d}" / "model.safetensors")
    assert exported.keys() == final.keys() and all(exported[k].equal(final[k]) for k in final)
    assert_no_children_alive(run_dir)  # signalled before the export, waited for after it
    resumed_from = int(output.split("resumed from")[1].split("(step ")[1].split(")")[0])
    assert resumed_from == last_good
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == total and resumed_from + 1 in steps
    assert [r["sync_zero_copy"] for r in rows[-2:]] == [1.0, 1.0]  # the checkpoint loaded into the weight arena
    state = json.loads((run_dir / "checkpoints" / f"step_{total:08d}" / "trainer_state.json").read_text())
    assert state["step"] == total
    assert state["data"]["epoch"] * state["data"]["num_problems"] + state["data"]["index"] == total * 4


def test_a_fresh_run_moves_an_earlier_run_aside(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"every": 1, "keep": 1})
    run_dir = tmp_path / "run"
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=2", "trainer.eval_every=0")
    assert code == 0, output[-4000:]
    (run_dir / "notes.txt").write_text("mine")  # not an rlx output: stays where it is
    code, output = run_to_end(config, tmp_path, "trainer.total_steps=1", "trainer.eval_every=0")
    assert code == 0, output[-4000:]
    archives = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("run.")]
    assert len(archives) == 1 and str(archives[0]) in output.replace("\n", "")
    assert [r["step"] for r in read_metrics(archives[0])] == [1, 2]
    assert [c.name for c in list_checkpoints(archives[0] / "checkpoints")] == ["step_00000002"]
    assert [r["step"] for r in read_metrics(run_dir)] == [1]  # not appended to the earlier run's
    # the earlier run's step 2 no longer prunes this run's step 1 (keep=1)
    assert [c.name for c in list_checkpoints(run_dir / "checkpoints")] == ["step_00000001"]
    assert (run_dir / "notes.txt").read_text() == "mine"


def start_long_run(tmp_path: Path, model_dir: Path):
    """A 200-step run (hf backend), returned once its first step is logged."""
    config = small_config(tmp_path, model_dir, "hf")
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), "trainer.total_steps=200", "trainer.eval_every=0"], log)
    run_dir = tmp_path / "run"
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() and read_metrics(run_dir), 300, proc, log)
    except BaseException:
        stop_group(proc)
        raise
    return proc, run_dir, log


def test_killed_rollout_server_stops_the_run_with_a_clear_error(tiny_model_dir, tmp_path):
    proc, run_dir, log = start_long_run(tmp_path, tiny_model_dir)
    try:
        os.killpg(child_pids(run_dir)["rollout0"], signal.SIGKILL)
        proc.wait(60)
    finally:
        stop_group(proc)
    assert proc.returncode == 1
    assert "rollout0" in log.read_text() and "exited" in log.read_text()
    assert_no_children_alive(run_dir)


def test_ctrl_c_leaves_no_child_alive(tiny_model_dir, tmp_path):
    proc, run_dir, log = start_long_run(tmp_path, tiny_model_dir)
    try:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        stop_group(proc)
    assert proc.returncode == 130, log.read_text()[-3000:]
    assert_no_children_alive(run_dir)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.path=/nonexistent/model", "model.path='/nonexistent/model' is not a Hugging Face model directory"),
        ("task.reward=no_such_module_xyz:score", "no_such_module_xyz"),
        ("trainer.learning_rate=1e-3", "did you mean 'trainer.lr'"),
    ],
)
def test_bad_config_fails_before_any_process_starts(override, message, tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf")
    result = CliRunner().invoke(app, ["train", str(config), override])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "task.reward" in result.output or "reward" not in override
    assert not (tmp_path / "run" / "logs").exists(), "a process was started before the config was checked"
