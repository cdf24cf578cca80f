"""A trainer and two rollout servers that talk only over TCP: the servers are separate
`rlx rollout-serve` processes bound to 127.0.0.1 with an auth token, the trainer joins them with
``rollout.servers: [tcp://...]``, and weights travel by gloo broadcast (no shared memory). Both
servers must hold CRC-verified trainer weights after each sync."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path

import pytest

from tests.helpers import start_rlx, stop_group, write_config

pytestmark = pytest.mark.slow

STEPS = 2
TOKEN = "disaggregated-test-token"
ENV = {"RLX_ROLLOUT_AUTH_TOKEN": TOKEN}
TOKEN_OVERRIDE = "rollout.auth_token=${oc.env:RLX_ROLLOUT_AUTH_TOKEN}"
SECTIONS = {
    "task": {"max_operand": 9, "num_eval": 8},
    "rollout": {"backend": "hf", "n": 4, "max_tokens": 4},
    "trainer": {"prompts_per_step": 4, "micro_batch_size": 8, "lr": 1e-3, "eval_every": 0, "total_steps": STEPS},
    "sync": {"transport": "gloo", "verify": True, "bucket_mb": 1, "timeout_s": 30},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(addresses: list[str], procs, timeout_s: float = 240.0) -> list:
    from rlx.rollout.client import RolloutClient, RolloutServerError

    client = RolloutClient(addresses, token=TOKEN)
    try:
        deadline = time.time() + timeout_s
        while True:
            assert all(proc.poll() is None for proc in procs), "a rollout server exited during start-up"
            try:
                return await client.stats()
            except RolloutServerError:
                if time.time() > deadline:
                    raise
    finally:
        client.close()


@pytest.fixture
def tcp_servers(tiny_model_dir, tmp_path):
    """Two rollout servers started on their own, as on other hosts: TCP, a token, their own traces."""
    from rlx.trace import ENV_TRACE_DIR

    config = write_config(tmp_path / "serve.yaml", tiny_model_dir, **SECTIONS)
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with contextlib.ExitStack() as stack:
        procs = []
        for index, address in enumerate(addresses):
            env = {**ENV, ENV_TRACE_DIR: str(tmp_path / "server-trace")}
            proc = start_rlx(
                ["rollout-serve", str(config), "--address", address, "--index", str(index), TOKEN_OVERRIDE],
                tmp_path / f"server{index}.log",
                env,
            )
            stack.callback(stop_group, proc)
            procs.append(proc)
        asyncio.run(wait_ready(addresses, procs))
        yield addresses, tmp_path / "server-trace"


def test_trainer_syncs_two_tcp_servers_over_gloo_with_verified_weights(tiny_model_dir, tmp_path, tcp_servers):
    addresses, server_trace = tcp_servers
    config = write_config(
        tmp_path / "train.yaml",
        tiny_model_dir,
        **dict(SECTIONS, trainer=dict(SECTIONS["trainer"], output_dir=str(tmp_path / "run")), trace={"enabled": True}),
    )
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), f"rollout.servers=[{','.join(addresses)}]", TOKEN_OVERRIDE], log, ENV)
    try:
        proc.wait(400)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, log.read_text()[-4000:]

    stats = asyncio.run(wait_ready(addresses, []))
    assert [s.weight_version for s in stats] == [STEPS, STEPS], "every sync reached every server"
    verified = verified_tensors_per_server(Path(tmp_path / "run" / "trace"))
    assert sorted(verified) == sorted(f"rollout server {a}" for a in addresses)
    num_params = len(trainer_parameter_names(tiny_model_dir))
    for server, count in verified.items():
        assert count == STEPS * num_params, f"{server}: {count} tensors verified in {STEPS} syncs of {num_params}"
    for index in range(2):  # each server loaded both syncs itself (its trace file is rollout<index>.<pid>.jsonl)
        [path] = server_trace.glob(f"rollout{index}.*jsonl")
        names = [json.loads(line).get("n") for line in path.read_text().splitlines()[1:]]
        assert names.count("sync.end") == STEPS and "sync.abort" not in names, f"rollout{index}: {names}"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["sync_zero_copy"] == 0.0 for r in rows)


def test_launched_and_external_servers_mix_and_both_receive_weights(tiny_model_dir, tmp_path, tcp_servers):
    """``rollout.servers`` lists a server started elsewhere and ``rollout.num_servers=1`` launches one more:
    the run uses both, and every sync reaches both with verified weights."""
    addresses, _ = tcp_servers
    external = addresses[0]
    config = write_config(
        tmp_path / "train.yaml",
        tiny_model_dir,
        **dict(SECTIONS, trainer=dict(SECTIONS["trainer"], output_dir=str(tmp_path / "run")), trace={"enabled": True}),
    )
    log = tmp_path / "train.log"
    proc = start_rlx(
        ["train", str(config), f"rollout.servers=[{external}]", "rollout.num_servers=1", TOKEN_OVERRIDE], log, ENV
    )
    try:
        proc.wait(400)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, log.read_text()[-4000:]
    [external_stats] = asyncio.run(wait_ready([external], []))
    assert external_stats.weight_version == STEPS and external_stats.completed > 0
    verified = verified_tensors_per_server(Path(tmp_path / "run" / "trace"))
    assert len(verified) == 2 and f"rollout server {external}" in verified, verified
    num_params = len(trainer_parameter_names(tiny_model_dir))
    assert all(count == STEPS * num_params for count in verified.values()), verified


def verified_tensors_per_server(trace_dir: Path) -> dict[str, int]:
    """Tensors whose CRC the trainer checked against each server's report, summed over the run."""
    counts: dict[str, int] = {}
    for path in trace_dir.glob("trainer*.jsonl"):
        for line in path.read_text().splitlines()[1:]:
            record = json.loads(line)
            if record.get("n") == "sync.verified":
                peer = record["a"]["peer"]
                counts[peer] = counts.get(peer, 0) + record["a"]["tensors"]
    return counts


def trainer_parameter_names(model_dir: Path) -> list[str]:
    from transformers import AutoModelForCausalLM

    return [name for name, _ in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()]
