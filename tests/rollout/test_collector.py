"""The collector's sampling: every prompt of a step draws from its own random stream."""

from __future__ import annotations

import asyncio

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


def test_the_same_prompt_twice_in_a_step_gets_different_samples(vllm_server, tmp_path, tiny_model_dir):
    """With one seed for the whole step, sample j of every prompt came from the same stream, so two
    copies of a prompt got identical groups and the batch's samples were correlated across prompts."""
    collector, client = _collector(vllm_server, tmp_path, tiny_model_dir)
    try:
        problems = [Problem(id=i, prompt="3+4=", answer="7") for i in range(3)]
        first = asyncio.run(collector.collect(problems, seed=11))
        again = asyncio.run(collector.collect(problems, seed=11))
    finally:
        client.close()
    groups = [first.completions[i * 4:(i + 1) * 4] for i in range(3)]
    token_groups = [tuple(map(tuple, first.batch.completion_ids[i * 4:(i + 1) * 4].tolist())) for i in range(3)]
    assert len(set(token_groups)) == 3, f"copies of one prompt drew the same samples: {groups}"
    assert first.completions == again.completions, "the same step seed must give the same samples"
