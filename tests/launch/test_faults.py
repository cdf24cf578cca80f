"""`rlx train` under faults and hostile surroundings: termination signals, failures mid-run, stray
modules in the working directory, secrets. Real launcher, real `hf` rollout server, real files."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlx.net import engine_socket_dir
from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import (
    assert_no_children_alive,
    child_pids,
    read_metrics,
    run_to_end,
    small_config,
    start_long_run,
    wait_for,
)

pytestmark = pytest.mark.slow


def sync_segments_of(pid: int) -> list[Path]:
    return sorted(Path("/dev/shm").glob(f"rlx-sync-{pid}-*"))


def assert_one_line_failure(output: str, run_dir: Path, *expected: str) -> str:
    """The console names what failed and the launcher's log; the traceback is only in that log."""
    log = run_dir / "logs" / "train.log"
    assert "Traceback" not in output, output[-3000:]
    assert str(log) in output.replace("\n", "")
    for text in expected:
        assert text in output, output[-3000:]
    text = log.read_text()
    assert "Traceback (most recent call last)" in text
    return text


def test_sigterm_tears_down_like_ctrl_c(tiny_model_dir, tmp_path):
    """SIGHUP takes the same path (tests/launch/test_death_watch.py)."""
    signum = signal.SIGTERM
    proc, run_dir, log = start_long_run(tmp_path, tiny_model_dir)
    try:
        assert sync_segments_of(proc.pid), "the run has no weight-sync buffer to leave behind"
        os.kill(proc.pid, signum)
        proc.wait(60)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 128 + signum, output[-3000:]
    assert f"received {signal.Signals(signum).name}: stopping every child process" in output
    assert "Traceback" not in output
    assert_no_children_alive(run_dir)
    assert not sync_segments_of(proc.pid)
    assert not (run_dir / "rollout-0.sock").exists()


REWARD = """
calls = 0

def score(completion, answer):
    global calls
    calls += 1
    if calls > 16:  # the first step's 4 prompts x 4 samples score; the second step's fail
        raise ValueError("reward model unreachable")
    return 0.0
"""


@pytest.mark.parametrize("fault", ["reward_raises", "server_stopped"])
def test_a_fault_mid_run_is_one_line_and_a_logged_traceback(fault, tiny_model_dir, tmp_path):
    (tmp_path / "faulty_reward.py").write_text(REWARD)
    # a stop that lands in a weight sync is noticed at the sync's deadline: as short as the requests'
    extra = (
        {"task": {"reward": "faulty_reward:score"}}
        if fault == "reward_raises"
        else {"rollout": {"request_timeout_s": 5.0}, "sync": {"timeout_s": 5.0}}
    )
    config = small_config(tmp_path, tiny_model_dir, "hf", **extra)
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = start_rlx(["train", str(config), "trainer.total_steps=200", "trainer.eval_every=0"], log, env)
    try:
        if fault == "server_stopped":
            wait_for(lambda: (run_dir / "metrics.jsonl").exists() and read_metrics(run_dir), 300, proc, log)
            os.killpg(child_pids(run_dir)["rollout0"], signal.SIGSTOP)
        proc.wait(300)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 1, output[-3000:]
    # a stopped server misses a Generate, or a Pause/Resume when the stop lands in a weight sync
    expected = "reward model unreachable" if fault == "reward_raises" else "did not answer"
    logged = assert_one_line_failure(output, run_dir, "the run failed", expected)
    assert expected in logged
    assert "stopping every child process; no checkpoint was written yet" in " ".join(output.split())
    assert_no_children_alive(run_dir)
    assert not sync_segments_of(proc.pid)


def test_a_dead_trainer_rank_is_named_in_one_line(tiny_model_dir, tmp_path):
    """Rank 0 may hear of the death from gloo before the watcher does: either way one line names the rank."""
    config = small_config(tmp_path, tiny_model_dir, "hf", trainer={"num_ranks": 2})
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), "trainer.total_steps=200", "trainer.eval_every=0"], log)
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() and read_metrics(run_dir), 300, proc, log)
        os.killpg(child_pids(run_dir)["trainer1"], signal.SIGKILL)
        proc.wait(120)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "trainer1 (pid" in output and "exited with code -9" in output
    assert_no_children_alive(run_dir)
    assert not sync_segments_of(proc.pid)


def shm_mapped_by_group(pgid: int) -> set[str]:
    """/dev/shm files the processes of group ``pgid`` map now (seen from /proc, as `ps` would)."""
    files = set()
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc_dir.name)) != pgid:
                continue
            lines = (proc_dir / "maps").read_text().splitlines()
        except OSError:
            continue
        fields = [line.split(maxsplit=5) for line in lines]
        files |= {f[5] for f in fields if len(f) == 6 and f[5].startswith("/dev/shm/")}
    return files


def test_a_killed_vllm_server_leaves_nothing_in_dev_shm(tiny_model_dir, tmp_path):
    """A sync-mode run on vLLM: its steps agree with the engine (verified syncs, zero-copy), then the server is
    SIGKILLed mid-run: the run stops with exit 1 and nothing of the server stays in /dev/shm, nor its engine's
    sockets in the temp dir."""
    config = small_config(tmp_path, tiny_model_dir, "vllm")
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    argv = ["train", str(config), "trainer.total_steps=2000", "trainer.eval_every=0", "sync.verify=true"]
    proc = start_rlx(argv, log)
    try:

        def steps() -> list[dict]:
            if not (run_dir / "metrics.jsonl").exists():
                return []
            return [row for row in read_metrics(run_dir) if "logprob_diff_mean" in row]

        wait_for(lambda: len(steps()) >= 2, 400, proc, log)
        for row in steps()[:2]:
            assert row["logprob_diff_mean"] < 0.05  # rollout engine and trainer agree (same weights each step)
            assert row["sync_zero_copy"] == 1.0  # one CPU rank: vLLM copied the weights straight out of the trainer's
        server = child_pids(run_dir)["rollout0"]
        left = {path for path in shm_mapped_by_group(server) if "/rlx-sync-" not in path}
        assert any("psm_" in path for path in left), left  # vLLM's broadcast buffers
        sockets = engine_socket_dir(server)
        assert [p for p in sockets.iterdir() if p.is_socket()], "the engine binds its sockets in the server's dir"
        os.killpg(server, signal.SIGKILL)
        proc.wait(120)
    finally:
        stop_group(proc)
    assert proc.returncode == 1
    assert not [path for path in left if Path(path).exists()]
    assert not sockets.exists(), list(sockets.iterdir())
    assert not sync_segments_of(proc.pid)


def test_modules_in_the_working_directory_are_not_imported(tiny_model_dir, tmp_path):
    """A stray typer.py / torch.py where `rlx train` starts runs in no process of the run."""
    work = tmp_path / "cwd"
    work.mkdir()
    for name in ("typer", "torch"):
        (work / f"{name}.py").write_text(f"open({str(tmp_path / (name + '.imported'))!r}, 'w').close()\n")
    config = small_config(tmp_path, tiny_model_dir, "hf")
    rlx = Path(sys.executable).with_name("rlx")  # the installed entry point, as users start it
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(rlx), "train", str(config), "trainer.total_steps=1", "trainer.eval_every=0"],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert not list(tmp_path.glob("*.imported"))


def test_the_auth_token_reaches_the_server_and_no_file_of_the_run(tiny_model_dir, tmp_path):
    token = "tok-" + os.urandom(8).hex()
    config = small_config(tmp_path, tiny_model_dir, "hf", trace={"enabled": True})
    code, output = run_to_end(
        config, tmp_path, "trainer.total_steps=1", "trainer.eval_every=0", f"rollout.auth_token={token}"
    )
    assert code == 0, output[-3000:]  # the server got the token: a wrong one is refused
    run_dir = tmp_path / "run"
    assert "auth_token: '***'" in (run_dir / "config.yaml").read_text()
    leaks = [p for p in run_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not leaks and token not in output
    assert "rollout-serve" in (run_dir / "logs" / "rollout0.log").read_text()  # its argv is logged, without it
    assert not (run_dir / "rollout-0.sock").exists()


def test_sigterm_stops_a_run_whose_reward_function_hangs(tiny_model_dir, tmp_path):
    """The user's reward runs off the event loop, so a hung one does not leave the launcher deaf to signals."""
    entered = tmp_path / "reward-entered"
    (tmp_path / "hanging_reward.py").write_text(
        f"import pathlib, time\n\ndef score(completion, answer):\n"
        f"    pathlib.Path({str(entered)!r}).touch()\n    time.sleep(3600)\n"
    )
    config = small_config(tmp_path, tiny_model_dir, "hf", task={"reward": "hanging_reward:score"})
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = start_rlx(["train", str(config), "trainer.eval_every=0"], log, env)
    try:
        wait_for(entered.exists, 300, proc, log)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "received SIGTERM: stopping every child process" in output and "Traceback" not in output
    assert_no_children_alive(run_dir)
    assert not sync_segments_of(proc.pid)


def test_a_reward_function_that_never_returns_stops_the_run_after_its_timeout(tiny_model_dir, tmp_path):
    (tmp_path / "stuck_reward.py").write_text("import time\n\ndef score(completion, answer):\n    time.sleep(3600)\n")
    config = small_config(tmp_path, tiny_model_dir, "hf", task={"reward": "stuck_reward:score", "reward_timeout_s": 2})
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = start_rlx(["train", str(config), "trainer.eval_every=0"], log, env)
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 1, output[-3000:]
    assert "has not returned after task.reward_timeout_s=2 s" in output and "Traceback" not in output, output[-3000:]
    assert "time.sleep(3600)" in (run_dir / "logs" / "train.log").read_text()  # where the reward was stuck
    assert_no_children_alive(run_dir)


def test_steps_whose_loss_is_not_finite_are_skipped_then_stop_the_run_with_finite_checkpoints(tiny_model_dir, tmp_path):
    """A reward so large (finite, as reward functions must return) that the loss overflows: each such step is
    skipped with a note and a metric, and trainer.max_nonfinite_steps in a row stop the run; the checkpoint
    written on the way holds the starting weights, no NaN."""
    from safetensors.torch import load_file

    (tmp_path / "huge_reward.py").write_text(
        "def score(completion, answer):\n    return 3e38 if sum(map(ord, completion)) % 2 else -3e38\n"
    )
    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        task={"reward": "huge_reward:score"},
        algorithm={"advantage": "drgrpo"},
        checkpoint={"every": 1},
        trainer={"eval_every": 0, "total_steps": 4, "max_nonfinite_steps": 2},
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log, env)
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    output, run_dir = log.read_text(), tmp_path / "run"
    assert proc.returncode == 1, output[-3000:]
    assert re.search(r"step 1: loss \S+ and gradient norm \S+ are not both finite; the update was skipped", output)
    assert_one_line_failure(
        output,
        run_dir,
        "NonFiniteSteps: steps 1..2: the loss or gradient norm was NaN or inf "
        "in 2 steps in a row (trainer.max_nonfinite_steps=2)",
    )
    assert [(m["step"], m["skipped_nonfinite"]) for m in read_metrics(run_dir)] == [(1, 1.0), (2, 1.0)]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_00000001"]  # step 2 stopped the run before its checkpoint
    saved = load_file(run_dir / "checkpoints" / "step_00000001" / "model.safetensors")
    start = load_file(tiny_model_dir / "model.safetensors")
    assert saved.keys() == start.keys() and all(torch.equal(saved[k], start[k]) for k in start)
