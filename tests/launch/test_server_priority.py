"""rollout.yield_cpu: on a CPU-only host in sync mode the launched servers (and the processes they
start) run at idle scheduling priority, and the trainer does not, and the servers are told to stop vLLM's
idle spin (RLX_ENGINE_NO_SPIN, tests/rollout/test_engine_spin.py); the setting turns both off."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import small_config

pytestmark = pytest.mark.slow

# Runs in rank 0 while the run is live: records the policy of every launched child and of itself.
REWARD = """
import json, os

def score(completion, answer):
    out = os.environ["POLICIES"]
    if not os.path.exists(out):
        pids = json.load(open(os.path.join(os.environ["RUN_DIR"], "logs", "pids.json")))
        policies = {name: os.sched_getscheduler(pid) for name, pid in pids.items()}
        policies["rank0"] = os.sched_getscheduler(0)
        no_spin = {name: b"RLX_ENGINE_NO_SPIN=1" in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
                   for name, pid in pids.items()}
        json.dump({"policies": policies, "no_spin": no_spin}, open(out, "w"))
    return 0.0
"""


@pytest.mark.parametrize("yield_cpu", [True, False])
def test_launched_servers_yield_the_cpu_to_the_trainer(yield_cpu, tiny_model_dir, tmp_path):
    (tmp_path / "policy_reward.py").write_text(REWARD)
    config = small_config(tmp_path, tiny_model_dir, "hf", task={"reward": "policy_reward:score"})
    out = tmp_path / "policies.json"
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "POLICIES": str(out),
        "RUN_DIR": str(tmp_path / "run"),
    }
    proc = start_rlx(
        [
            "train",
            str(config),
            "trainer.total_steps=1",
            "trainer.eval_every=0",
            f"rollout.yield_cpu={str(yield_cpu).lower()}",
        ],
        tmp_path / "train.log",
        env,
    )
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, (tmp_path / "train.log").read_text()[-3000:]
    recorded = json.loads(out.read_text())
    policies = recorded["policies"]
    servers = [policy for name, policy in policies.items() if name.startswith("rollout")]
    assert recorded["no_spin"] and all(value == yield_cpu for value in recorded["no_spin"].values()), recorded
    assert servers and policies["rank0"] == os.SCHED_OTHER
    assert all(policy == (os.SCHED_IDLE if yield_cpu else os.SCHED_OTHER) for policy in servers), policies
