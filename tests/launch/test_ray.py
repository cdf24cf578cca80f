"""`rlx train launcher=ray` on a real two-node Ray cluster (two raylets on this machine, made with
``ray.cluster_utils.Cluster``): trainer ranks on node A and rollout servers on node B (custom
resources), TCP with a token, weights by gloo broadcast, CRC-verified; a SIGKILLed rank stops the run
naming it; nothing of a run is left afterwards; `rlx doctor` checks the cluster and names a broken
layout. One cluster serves every test of the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import start_rlx, stop_group, write_config

pytestmark = pytest.mark.slow

STEPS = 2
SECTIONS = {
    "task": {"max_operand": 9, "num_eval": 8},
    "rollout": {"backend": "hf", "n": 4, "max_tokens": 4, "num_servers": 2},
    "trainer": {
        "prompts_per_step": 4,
        "micro_batch_size": 8,
        "lr": 1e-3,
        "eval_every": 0,
        "total_steps": STEPS,
        "num_ranks": 2,
    },
    "sync": {"transport": "gloo", "verify": True, "bucket_mb": 1, "timeout_s": 60},
    "ray": {"trainer_resources": {"CPU": 1, "node_a": 1}, "rollout_resources": {"CPU": 1, "node_b": 1}},
}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not reaped yet
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes on this machine, node_a (the head) and node_b; every Ray process it started ends by pid."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 3, "resources": {"node_a": 4}, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=3, resources={"node_b": 4})
    cluster.wait_for_nodes()
    pids = [
        info.process.pid for node in cluster.list_all_nodes() for infos in node.all_processes.values() for info in infos
    ]
    try:
        yield cluster
    finally:
        cluster.shutdown()
        deadline = time.time() + 20
        while any(pid_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if pid_alive(p)], "Ray processes of the test cluster outlived it"


def ray_config(tmp_path, model_dir, address: str, **changes):
    sections = {k: dict(v) for k, v in SECTIONS.items()}
    for section, values in changes.items():
        sections.setdefault(section, {}).update(values)
    sections["ray"]["address"] = address
    sections["trainer"]["output_dir"] = str(tmp_path / "run")
    return write_config(tmp_path / "train.yaml", model_dir, launcher="ray", **sections)


def recorded_processes(run_dir) -> dict:
    path = run_dir / "logs" / "ray_processes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_ray_run_places_roles_on_their_nodes_syncs_verified_weights_and_leaves_nothing(
    ray_cluster, tiny_model_dir, tmp_path
):
    from tests.launch.test_disaggregated import (
        trainer_parameter_names,
        verified_tensors_per_server,
    )

    config = ray_config(tmp_path, tiny_model_dir, ray_cluster.address, trace={"enabled": True})
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log)
    try:
        proc.wait(400)
    finally:
        stop_group(proc)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, log.read_text()[-4000:]

    processes = recorded_processes(run_dir)
    assert sorted(processes) == ["rollout0", "rollout1", "trainer0", "trainer1"]
    node_of = {name: p["node_id"] for name, p in processes.items()}
    head = ray_cluster.head_node.node_id
    assert node_of["trainer0"] == node_of["trainer1"] == head, "trainer ranks sit on node_a (the head)"
    assert node_of["rollout0"] == node_of["rollout1"] != head, "rollout servers sit on node_b"
    leftover = [(n, pid) for n, p in processes.items() for pid in (p["pid"], p["actor_pid"]) if pid_alive(pid)]
    assert not leftover, f"processes of the run still alive: {leftover}"
    kept = [p["workdir"] for p in processes.values() if Path(p["workdir"]).exists()]
    assert not kept, f"work directories of the run's actors left behind: {kept}"

    verified = verified_tensors_per_server(run_dir / "trace")
    num_params = len(trainer_parameter_names(tiny_model_dir))
    assert len(verified) == 2 and all(count == STEPS * num_params for count in verified.values()), verified
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for name in processes:  # each process's output gathered into the run's logs
        assert (run_dir / "logs" / f"{name}.log").read_text().startswith(f"rlx: starting {name} on ")


def test_sigkilled_rank_stops_the_ray_run_naming_it(ray_cluster, tiny_model_dir, tmp_path):
    config = ray_config(
        tmp_path, tiny_model_dir, ray_cluster.address, rollout={"num_servers": 1}, trainer={"total_steps": 50}
    )
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log)
    run_dir = tmp_path / "run"
    try:
        deadline = time.time() + 180
        while "trainer1" not in recorded_processes(run_dir):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        victim = recorded_processes(run_dir)["trainer1"]["pid"]
        assert victim > 1, f"trainer1 recorded with pid {victim}"  # os.kill(0 or -1) would kill far more
        os.kill(victim, 9)
        proc.wait(120)
    finally:
        stop_group(proc)
    text = log.read_text()
    assert proc.returncode == 1, text[-4000:]
    assert f"trainer1 (pid {victim} on " in text and "exited with code -9" in text, text[-4000:]
    processes = recorded_processes(run_dir)
    leftover = [(n, pid) for n, p in processes.items() for pid in (p["pid"], p["actor_pid"]) if pid_alive(pid)]
    assert not leftover, f"processes of the run still alive: {leftover}"


def test_doctor_checks_the_cluster_and_names_a_missing_resource_and_a_busy_port(ray_cluster, tiny_model_dir, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind((ray_cluster.head_node.node_ip_address, 0))
        busy.listen()
        port = busy.getsockname()[1]
        broken = ray_config(
            tmp_path,
            tiny_model_dir,
            ray_cluster.address,
            rollout={"port": port},
            ray={"trainer_resources": {"CPU": 1, "node_c": 1}},
        )
        result = subprocess.run(
            [sys.executable, "-m", "rlx", "doctor", str(broken), "--broadcast-mb", "1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=180,
            env=dict(os.environ, COLUMNS="250"),
        )  # table rows unwrapped
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no node of the cluster has resource 'node_c'" in result.stdout, result.stdout
    assert f"port {port} is taken on {ray_cluster.head_node.node_ip_address}" in result.stdout, result.stdout
    assert "2 problem(s) found" in result.stdout, result.stdout
    assert result.stdout.count("gloo broadcast") == 1 and "GiB/s" in result.stdout, "one node pair, measured"
    assert "rollout placement" in result.stdout and "room for 3 on 2 node(s)" in result.stdout, result.stdout
