"""The collector's sampling: every prompt of a step draws from its own random stream."""

from __future__ import annotations

import asyncio

import pytest

from rlx.rollout.client import RolloutClient
from rlx.rollout.collector import Collector
from rlx.rollout.tasks import Problem


class _Task:
    def reward(self, completion, problem):
        return 0.0

    def is_correct(self, completion, problem):
        return False


def _collector(address: str, tmp_path, tiny_model_dir) -> tuple[Collector, RolloutClient]:
    from rlx.config import load_config
    from tests.helpers import write_config

    cfg = load_config(write_config(tmp_path / "c.yaml", tiny_model_dir,
                                   rollout={"n": 4, "max_tokens": 6, "temperature": 1.0}))
    client = RolloutClient([address])
    return Collector(cfg, client, _Task(), pad_id=0), client


@pytest.fixture(params=["vllm", "hf"])
def server(request, tmp_path_factory, tiny_model_dir):
    if request.param == "vllm":
        yield request.getfixturevalue("vllm_server")
        return
    from tests.helpers import serve

    with serve(tiny_model_dir, "hf", tmp_path_factory.mktemp("hf_server")) as (address, _):
        yield address


def test_the_same_prompt_twice_in_a_step_gets_different_samples(server, tmp_path, tiny_model_dir):
    """With one seed for the whole step, sample j of every prompt came from the same stream, so two
    copies of a prompt got identical groups and the batch's samples were correlated across prompts.
    The hf backend batches requests that differ only in their seed and draws all rows from one stream."""
    collector, client = _collector(server, tmp_path, tiny_model_dir)
    try:
        problems = [Problem(id=i, prompt="3+4=", answer="7") for i in range(3)]
        async def twice():
            return await collector.collect(problems, seed=11), await collector.collect(problems, seed=11)

        first, again = asyncio.run(twice())
    finally:
        client.close()
    groups = [first.completions[i * 4:(i + 1) * 4] for i in range(3)]
    token_groups = [tuple(map(tuple, first.batch.completion_ids[i * 4:(i + 1) * 4].tolist())) for i in range(3)]
    assert len(set(token_groups)) == 3, f"copies of one prompt drew the same samples: {groups}"
    assert first.completions == again.completions, "the same step seed must give the same samples"


def test_a_seeded_step_larger_than_one_engine_step_generates(vllm_server, tmp_path, tiny_model_dir):
    """Enough prompt tokens in one step that vLLM would split a prefill across engine steps: its CPU
    worker then fails every seeded request ("CPU Generator does not use offset"), so the CPU engine
    runs without chunked prefill."""
    collector, client = _collector(vllm_server, tmp_path, tiny_model_dir)
    prompt = "+".join(["7"] * 40) + "="  # 80 tokens; 48 prompts x 4 samples is about 15k prompt tokens
    try:
        collected = asyncio.run(collector.collect([Problem(id=i, prompt=prompt, answer="280") for i in range(48)],
                                                  seed=5))
    finally:
        client.close()
    assert collected.batch.size == 48 * 4
    assert int(collected.batch.mask.sum()) > 0
