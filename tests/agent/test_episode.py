"""Token-in/token-out episodes against a real vLLM server: what the trainer's batch holds is exactly
what the engine sampled, turn after turn, and the loss covers the policy's tokens only."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from rlx.agent.env import StepResult
from rlx.agent.episode import Episode, Turn
from rlx.agent.framing import PlainFraming
from rlx.orchestrator.episode_loop import run_episode
from rlx.rollout.client import RolloutClient
from rlx.rollout.protocol import SamplingSpec
from rlx.tasks.base import Problem
from rlx.trainer.batch import build_batch
from rlx.trainer.logprobs import completion_logprobs
from rlx.trainer.packing import build

pytestmark = pytest.mark.slow

PROBLEMS = [Problem(0, "12+7=", "19"), Problem(1, "3*47+5=", "146")]


class ScriptedEnv:
    """Answers every turn with a fixed observation; done after three turns."""

    def __init__(self) -> None:
        self.turns = 0

    async def reset(self, problem: Problem) -> str:
        return problem.prompt

    async def step(self, turn: Turn) -> StepResult:
        self.turns += 1
        return StepResult(f"<o>{self.turns}?</o>\n", done=self.turns == 3)


class RecordingClient(RolloutClient):
    """A real client that also keeps the prompt ids the server reports for every generate call."""

    def __init__(self, addresses) -> None:
        super().__init__(addresses)
        self.prompts: list[list[int]] = []

    async def generate(self, prompts, sampling, timeout_s=None):
        results = await super().generate(prompts, sampling, timeout_s)
        self.prompts += [r.prompt_token_ids for r in results]
        return results


def test_episodes_are_token_in_token_out_and_the_batch_holds_the_engines_tokens(vllm_server, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    sampling = SamplingSpec(temperature=1.0, max_tokens=6, seed=11)

    async def main() -> tuple[list[Episode], list[list[int]]]:
        client = RecordingClient([vllm_server])
        try:
            episodes = []
            for problem in PROBLEMS:  # one at a time, so the recorded prompts are in turn order
                episodes.append(
                    await run_episode(
                        client,
                        ScriptedEnv(),
                        problem,
                        PlainFraming(tokenizer),
                        sampling,
                        max_turns=4,
                        max_total_tokens=200,
                        timeout_s=120,
                    )
                )
            return episodes, client.prompts
        finally:
            client.close()

    episodes, prompts = asyncio.run(main())
    sent = iter(prompts)
    for episode in episodes:
        assert len(episode.turns) == 3 and episode.done_reason == "done"
        context = list(episode.prompt_ids)
        for k, turn in enumerate(episode.turns):
            prompt = next(sent)
            assert prompt == context, f"turn {k}'s prompt is not the episode's ids so far"
            context = prompt + turn.token_ids + turn.observation_ids
            assert turn.observation_ids == (encode(f"<o>{k + 1}?</o>\n") if k < 2 else [])
            assert len(turn.logprobs) == len(turn.token_ids) >= 1
    for a, b in itertools.pairwise(prompts[:3]):  # turn k+1's prompt starts with turn k's exact ids
        assert b[: len(a)] == a and len(b) > len(a)

    rows = [e.row() for e in episodes]
    batch = build_batch(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [1.0, 0.0],
        tokenizer.pad_token_id,
        token_masks=[r[3] for r in rows],
    )
    for i, episode in enumerate(episodes):
        policy = batch.mask[i].bool()
        sampled = [t for turn in episode.turns for t in turn.token_ids]
        engine_logps = [lp for turn in episode.turns for lp in turn.logprobs]
        assert batch.completion_ids[i][policy].tolist() == sampled
        assert torch.equal(batch.rollout_logp[i][policy], torch.tensor(engine_logps, dtype=torch.float32))
        observations = sum(len(t.observation_ids) for t in episode.turns)
        length = len(sampled) + observations
        assert int(batch.mask[i].sum()) == len(sampled)
        assert int((batch.mask[i][:length] == 0).sum()) == observations  # observation tokens: context only
        assert batch.completion_ids[i][:length].tolist() == rows[i][1]

    # the trainer scores exactly the policy tokens, where the engine sampled them
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = build(batch, [0, 1], packed=False)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, mb, 1.0, 64, split_head=True)
    assert torch.all(logp[batch.mask == 0] == 0)
    torch.testing.assert_close(logp[batch.mask == 1], batch.rollout_logp[batch.mask == 1], atol=2e-3, rtol=0)
