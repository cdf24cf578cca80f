"""Multi-turn tool episodes on a real chat model (SmolLM2-135M-Instruct, its own chat template) against one
real vLLM server: the calls are parsed from what the model writes, every turn after the first is framed by
the chat template as token ids, the episode's ids are the template's rendering of the same conversation,
and the trainer scores exactly the tokens the engine sampled."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlx.agent.env import ToolEnv, ToolStats
from rlx.agent.framing import ChatFraming
from rlx.agent.tools import BUILTIN, tool_schemas
from rlx.agent.workers import WorkerPool
from rlx.orchestrator.episode_loop import run_episode
from rlx.rollout.protocol import SamplingSpec
from rlx.tasks.base import Problem
from rlx.tasks.calc import Calc
from tests.agent.test_episode import RecordingClient

pytestmark = pytest.mark.slow

TOOLS = {"calc": BUILTIN["calc"]}
PROBLEMS = [Problem(0, "47*38=", "1786"), Problem(1, "21*93=", "1953")]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def run_episodes(address, tokenizer, problems, sampling):
    framing = ChatFraming(tokenizer, tools=tool_schemas(TOOLS))
    task = Calc(problems, [])

    async def main():
        client = RecordingClient([address])
        try:
            async with WorkerPool("tool", 1, timeout_s=10.0, memory_mb=512) as pool:
                episodes = []
                for problem in problems:  # one at a time, so the recorded prompts are in turn order
                    env = ToolEnv(TOOLS, pool, "hermes", ToolStats(), task, chat=True)
                    episodes.append(
                        await run_episode(
                            client, env, problem, framing, sampling, max_turns=3, max_total_tokens=1024, timeout_s=300
                        )
                    )
            return episodes, client.prompts
        finally:
            client.close()

    return framing, task, *asyncio.run(main())


def test_episode_ids_are_the_chat_templates_rendering_of_the_conversation(smollm2_server, tokenizer):
    framing, task, episodes, prompts = run_episodes(
        smollm2_server, tokenizer, PROBLEMS, SamplingSpec(temperature=0.0, max_tokens=48)
    )
    sent = iter(prompts)
    for problem, episode in zip(PROBLEMS, episodes, strict=True):
        first = episode.turns[0]
        [call] = first.tool_calls  # parsed from the model's own text
        assert (call.name, call.ok) == ("calc", True), first.text
        assert call.arguments["expression"].replace(" ", "") == problem.prompt.rstrip("=")
        assert first.observation_messages == [{"role": "tool", "content": problem.answer}]
        assert len(episode.turns) >= 2 and episode.done_reason == "done"
        conversation = framing.messages(task.messages(problem))
        context = list(episode.prompt_ids)
        for turn in episode.turns:
            assert next(sent) == context, "a turn's prompt is not the episode's ids so far"
            context += turn.token_ids + turn.observation_ids
            content = tokenizer.decode(turn.token_ids, skip_special_tokens=True)
            conversation += [{"role": "assistant", "content": content}, *turn.observation_messages]
        assert context == episode.context()
        rendered = tokenizer(framing.render(conversation, generation_prompt=False), add_special_tokens=False)[
            "input_ids"
        ]
        assert episode.turns[-1].token_ids[-1] == tokenizer.eos_token_id  # the model ended its last turn itself
        assert rendered[: len(context)] == context
        assert tokenizer.decode(rendered[len(context) :]) == "\n"  # what ChatML writes after the final <|im_end|>
        # the framing between turns is the template's: end of turn (sampled by the model), tool turn, header
        assert (
            tokenizer.decode(first.observation_ids) == f"\n<|im_start|>tool\n{problem.answer}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )


def test_the_loss_covers_the_sampled_tokens_and_the_trainer_scores_them_as_the_engine_did(
    smollm2_server, tokenizer, smollm2_dir
):
    from transformers import AutoModelForCausalLM

    from rlx.trainer.batch import build_batch
    from rlx.trainer.logprobs import completion_logprobs
    from rlx.trainer.packing import build

    _, _, episodes, _ = run_episodes(
        smollm2_server, tokenizer, PROBLEMS[:1], SamplingSpec(temperature=1.0, max_tokens=32, seed=3)
    )
    rows = [e.row() for e in episodes]
    batch = build_batch(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [1.0],
        tokenizer.pad_token_id,
        token_masks=[r[3] for r in rows],
    )
    episode = episodes[0]
    sampled = [t for turn in episode.turns for t in turn.token_ids]
    policy = batch.mask[0].bool()
    assert batch.completion_ids[0][policy].tolist() == sampled
    assert int(batch.mask[0].sum()) == len(sampled)
    framed = sum(len(t.observation_ids) for t in episode.turns)
    assert int((batch.mask[0][: len(sampled) + framed] == 0).sum()) == framed
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp, _ = completion_logprobs(model, build(batch, [0], packed=False), 1.0, 64, split_head=True)
    torch.testing.assert_close(logp[batch.mask == 1], batch.rollout_logp[batch.mask == 1], atol=2e-3, rtol=0)
