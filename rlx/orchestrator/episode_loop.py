"""``run_episode``: the policy and an environment take turns, as token ids, until one stops.

Each turn sends the episode's whole context as ``prompt_token_ids`` (``Episode.context()``: the
first prompt, every earlier turn's exact sampled ids and every observation's ids), so nothing is
re-tokenised and the trainer later scores exactly what the engine sampled. The framing
(``rlx.agent.framing``) makes the first prompt's ids and, after each turn, the observation's:
as plain text, or framed by the model's chat template (end of turn, tool messages, next header). A turn gets at most
``rollout.max_tokens`` new tokens and never more than the episode's remaining token budget.
The episode ends when the environment says done, after ``max_turns`` turns, or when the budget
is spent; an observation that no further turn would read is dropped.
"""

from __future__ import annotations

import msgspec

from rlx.agent.env import Environment
from rlx.agent.episode import Episode, Turn
from rlx.rollout.client import RolloutClient
from rlx.rollout.protocol import SamplingSpec
from rlx.tasks.base import Problem
from rlx.trace import tracer


async def run_episode(
    client: RolloutClient,
    env: Environment,
    problem: Problem,
    framing,
    sampling: SamplingSpec,
    max_turns: int,
    max_total_tokens: int,
    timeout_s: float,
) -> Episode:
    """One episode on ``problem``; ``framing`` (``PlainFraming`` / ``ChatFraming``) makes the prompt's and the
    observations' ids. ``sampling.seed`` (if set) seeds turn k with ``seed + k``."""
    episode = Episode(prompt_ids=framing.prompt_ids(await env.reset(problem)))
    if len(episode.prompt_ids) >= max_total_tokens:
        raise ValueError(
            f"the first prompt of problem {problem.id} is {len(episode.prompt_ids)} tokens, which leaves "
            f"no room for a turn within agent.max_total_tokens={max_total_tokens} (also bounded by "
            "rollout.max_model_len); raise both above the prompt plus the turns"
        )
    for k in range(max_turns):
        context = episode.context()
        budget = max_total_tokens - len(context)
        if budget < 1:
            episode.done_reason = "max_total_tokens"
            break
        spec = msgspec.structs.replace(
            sampling,
            n=1,
            max_tokens=min(sampling.max_tokens, budget),
            seed=None if sampling.seed is None else sampling.seed + k,
        )
        with tracer.span("agent.turn", turn=k, prompt_tokens=len(context)) as span:
            result = (await client.generate([context], spec, timeout_s=timeout_s))[0]
            sample = result.samples[0]
            span.set(completion_tokens=len(sample.token_ids), finish_reason=sample.finish_reason)
        turn = Turn(
            token_ids=list(sample.token_ids),
            logprobs=list(sample.logprobs),
            text=sample.text,
            finish_reason=sample.finish_reason,
            versions=list(sample.versions),
        )
        episode.turns.append(turn)
        step = await env.step(turn)
        turn.tool_calls = step.tool_calls
        if step.reward is not None:
            episode.env_reward = step.reward
        if step.done:
            episode.done_reason = "done"
            break
        observation_ids = framing.observation_ids(turn.token_ids, step.observation, step.messages)
        if k + 1 == max_turns or episode.num_tokens + len(observation_ids) >= max_total_tokens:
            episode.done_reason = "max_turns" if k + 1 == max_turns else "max_total_tokens"
            break
        turn.observation, turn.observation_ids = step.observation, observation_ids
        turn.observation_messages = step.messages
    return episode
