"""Sleep / WakeUp on real rollout servers: the hf backend and vLLM's CPU build (which accepts sleep mode's
calls and frees nothing). While asleep a server schedules nothing; it generates again once every tag woke."""

from __future__ import annotations

import asyncio

import pytest

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient, RolloutServerError
from tests.helpers import serve

SAMPLING = p.SamplingSpec(n=2, temperature=1.0, max_tokens=4, seed=3)


def sleep_and_wake(address: str) -> None:
    async def scenario() -> None:
        client = RolloutClient([address], timeout_s=60.0)
        try:
            asleep = await client.call(0, p.Sleep(level=1))
            assert isinstance(asleep, p.MemoryResult) and asleep.asleep == ["kv_cache", "weights"]
            assert asleep.memory_gb == 0.0  # a CPU-only host holds no accelerator memory
            with pytest.raises(RolloutServerError, match="did not answer Generate|deadline"):  # queued, never scheduled
                await client.generate(["1+2="], SAMPLING, timeout_s=1.5)
            assert (await client.call(0, p.WakeUp(tags=["weights"]))).asleep == ["kv_cache"]
            with pytest.raises(
                RolloutServerError, match="did not answer Generate|deadline"
            ):  # the KV cache still sleeps
                await client.generate(["1+2="], SAMPLING, timeout_s=1.0)
            assert (await client.call(0, p.WakeUp(tags=["kv_cache"]))).asleep == []
            result = (await client.generate(["1+2="], SAMPLING, timeout_s=60.0))[0]
            assert len(result.samples) == 2 and all(s.token_ids for s in result.samples)
            assert (await client.call(0, p.WakeUp())).asleep == []  # waking an awake engine changes nothing
        finally:
            client.close()

    asyncio.run(scenario())


def test_hf_server_sleeps_and_wakes(tiny_model_dir, tmp_path):
    with serve(tiny_model_dir, "hf", tmp_path) as (address, _):
        sleep_and_wake(address)


@pytest.mark.slow
def test_vllm_server_sleeps_and_wakes(vllm_server):
    sleep_and_wake(vllm_server)
