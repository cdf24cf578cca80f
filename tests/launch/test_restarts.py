"""rollout.restart_on_failure: a SIGKILLed rollout server is restarted, rejoins with the trainer's current
weights, and the run finishes; one that keeps dying stops the run with a line naming it. Real launcher,
real `hf` rollout server processes, real signals."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.helpers import start_rlx, stop_group, wait_ready
from tests.launch.test_train import (
    assert_no_children_alive,
    child_pids,
    read_metrics,
    small_config,
    wait_for,
)

pytestmark = pytest.mark.slow

STEPS = 6

# Scores the first step at once, then waits (at step 2's first sample) until the test has killed and
# seen restarted the server, so that steps remain whatever the machine's speed.
REWARD = """
import os, time

calls = 0

def score(completion, answer):
    global calls
    calls += 1
    if calls == 17:  # 4 prompts x 4 samples a step
        open(os.environ["HELD"], "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.05)
    return 0.0
"""


def trace_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def start_run(tmp_path: Path, tiny_model_dir: Path, *overrides: str):
    (tmp_path / "held_reward.py").write_text(REWARD)
    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        trace={"enabled": True},
        task={"reward": "held_reward:score"},
        rollout={"restart_on_failure": True},
        sync={"verify": True},
    )
    log = tmp_path / "train.log"
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "HELD": str(tmp_path / "held"),
        "GO": str(tmp_path / "go"),
    }
    proc = start_rlx(
        ["train", str(config), f"trainer.total_steps={STEPS}", "trainer.eval_every=0", *overrides], log, env
    )
    return proc, tmp_path / "run", log


@pytest.mark.parametrize("num_servers", [1, 2])
def test_a_killed_server_is_restarted_with_the_newest_weights_and_the_run_finishes(
    num_servers, tiny_model_dir, tmp_path
):
    """One server: generation waits for it. Two: the other generates and takes the syncs meanwhile. The run
    is held (in its reward) until the restarted server answers, so that it rejoins before the run ends."""
    proc, run_dir, log = start_run(tmp_path, tiny_model_dir, f"rollout.num_servers={num_servers}")
    try:
        wait_for((tmp_path / "held").exists, 300, proc, log)
        killed = child_pids(run_dir)["rollout0"]
        os.killpg(killed, signal.SIGKILL)
        wait_for(lambda: child_pids(run_dir)["rollout0"] != killed, 60, proc, log)
        wait_ready(f"ipc://{run_dir / 'rollout-0.sock'}", proc, log)  # so it rejoins before the run ends
        (tmp_path / "go").touch()
        proc.wait(400)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    assert f"rollout0 (pid {killed}) exited with code -9" in output and "restart 1 of 3" in output, output[-4000:]
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert metrics[0]["rollout_restarts"] == 0 and metrics[-1]["rollout_restarts"] == 1
    restarted = child_pids(run_dir)["rollout0"]
    assert restarted != killed
    assert "rlx: starting rollout0" in (run_dir / "logs" / "rollout0.log").read_text().split(str(killed))[-1]

    trainer = [r for path in sorted((run_dir / "trace").glob("trainer0.*.jsonl")) for r in trace_records(path)]
    [restart] = [r for r in trainer if r.get("n") == "rollout.restart"]
    [rejoined] = [r for r in trainer if r.get("n") == "rollout.rejoined"]
    assert restart["a"]["server"] == "rollout0" and rejoined["a"]["weight_version"] == 1
    # every sync after the rejoin reached the restarted server and was verified there
    syncs_after = [
        r for r in trainer if r.get("n") == "sync" and r["t"] > rejoined["t"] and "server" not in r.get("a", {})
    ]
    assert syncs_after, "the run ended before a regular sync reached the restarted server"
    server = trace_records(run_dir / "trace" / f"rollout0.{restarted}.jsonl")
    versions = [r["a"]["weight_version"] for r in server if r.get("n") == "sync.end"]
    # its own count at the rejoin (1) and the regular sync after it (2); from then on each regular sync's
    # Resume names the step it synced, and the next sync ends one past it (the last syncs are steps
    # STEPS - n + 1 .. STEPS, however late the rejoin came)
    n = len(syncs_after)
    assert versions == [1, 2] + list(range(STEPS - n + 2, STEPS + 1)), (versions, n)
    verified = [r for r in trainer if r.get("n") == "sync.verified" and r["t"] > rejoined["t"]]
    restarted_peer = f"rollout server {restart['a']['address']}"
    assert sum(r["a"]["peer"] == restarted_peer for r in verified) >= len(syncs_after), verified
    assert_no_children_alive(run_dir)


def test_a_server_that_keeps_dying_stops_the_run_once_its_restarts_are_spent(tiny_model_dir, tmp_path):
    proc, run_dir, log = start_run(tmp_path, tiny_model_dir, "rollout.max_restarts=1")
    try:
        wait_for((tmp_path / "held").exists, 300, proc, log)
        first = child_pids(run_dir)["rollout0"]
        os.killpg(first, signal.SIGKILL)
        wait_for(lambda: child_pids(run_dir)["rollout0"] != first, 60, proc, log)
        second = child_pids(run_dir)["rollout0"]
        os.killpg(second, signal.SIGKILL)
        (tmp_path / "go").touch()
        proc.wait(120)
    finally:
        stop_group(proc)
    output = log.read_text()
    assert proc.returncode == 1, output[-4000:]
    assert f"rollout0 (pid {second}) exited with code -9" in output, output[-4000:]
    assert "restarted 1 time(s) already and rollout.max_restarts=1 allows no more" in output, output[-4000:]
    assert "Traceback" not in output
    assert_no_children_alive(run_dir)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_requests_in_flight_to_a_dead_server_are_reissued_to_a_live_one(sig, tiny_model_dir, tmp_path):
    """What the launcher does on a death (``mark_down`` once the process has exited), done by hand: every
    prompt still gets its answer. A SIGTERMed server first answers its requests that it is stopping; they
    wait for the mark and are re-issued too."""
    import asyncio

    from rlx.rollout import protocol as p
    from rlx.rollout.client import RolloutClient
    from tests.helpers import serve_with

    sections = {"rollout": {"backend": "hf", "max_model_len": 256}}
    with (
        serve_with(tiny_model_dir, tmp_path, "a", **sections) as (live, _),
        serve_with(tiny_model_dir, tmp_path, "b", **sections) as (doomed, doomed_proc),
    ):

        async def go():
            client = RolloutClient([live, doomed], timeout_s=120.0, awaits_restarts=True)
            try:
                sampling = p.SamplingSpec(n=8, max_tokens=128, temperature=1.0, seed=1)  # long enough to stop mid-way
                work = asyncio.create_task(client.generate([f"{i}+{i}=" for i in range(12)], sampling))
                while client._peers[1].in_flight == 0:
                    await asyncio.sleep(0.01)
                in_flight = client._peers[1].in_flight
                os.killpg(doomed_proc.pid, sig)
                await asyncio.to_thread(doomed_proc.wait, 30)
                client.mark_down(1)
                results = await work
                return in_flight, results
            finally:
                client.close()

        in_flight, results = asyncio.run(go())
    assert in_flight > 0
    assert len(results) == 12 and all(len(r.samples) == 8 for r in results)
