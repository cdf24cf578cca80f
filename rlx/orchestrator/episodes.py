"""A step's multi-turn episodes as ``Sample``s (one per episode), and their greedy evaluation.

``EpisodeCollector`` runs every (problem, sample) episode at once (``run_episode``), each with its
own seed, against a ``ToolEnv`` or, for ``task.name=openenv``, a session on the OpenEnv server
(``rlx.agent.openenv``, closed when the episode ends); as soon as an episode ends, its reward is
computed in the reward workers (the task's
``reward_ref`` or ``task.reward``; a task without either scores in this process), so rewards and
tool calls overlap the generation of other episodes. A reward call that fails or times out gives
that sample 0 and counts in ``reward_errors``. One row per episode: the first prompt, then
everything after it, with the loss mask on policy tokens only (``Episode.row``).

Turns are framed by the model's chat template when it has one (``task.chat_template``: auto, on,
off; ``rlx.agent.framing``), with ``task.system_prompt`` and the tools' schemas. The task's
stop strings (calc's ``</calc>``) end turns only in the plain tool format; a chat model ends its turn
with its end-of-turn token.

Metrics, beside the single-turn ones: ``turns_per_episode``, ``tool_calls_per_episode``,
``tool_call_success_rate`` (calls that returned a result / calls), ``tool_errors``,
``tool_timeouts``, ``reward_errors``.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass
from numbers import Real

import msgspec

from rlx.agent.env import ToolEnv, ToolStats
from rlx.agent.episode import Episode
from rlx.agent.framing import make_framing
from rlx.agent.tools import is_multi_turn, resolve_tools, tool_entries, tool_schemas
from rlx.agent.workers import WorkerPool
from rlx.config.schema import RunConfig
from rlx.orchestrator.episode_loop import run_episode
from rlx.rollout.client import RolloutClient
from rlx.rollout.protocol import SamplingSpec
from rlx.store.base import Sample
from rlx.tasks.base import Problem, Task
from rlx.tasks.reward_models import make_reward_model, mix, score_step
from rlx.trace import tracer

MAX_PROMPTS_PER_STEP = 1 << 20
EVAL_SEED = 7919
"""Seeds of sampled held-out evaluation (``trainer.eval_temperature`` > 0), apart from every step's."""

__all__ = ["EpisodeCollector", "EpisodeGroup", "episode_metrics", "is_multi_turn"]


@dataclass
class EpisodeGroup:
    """One problem's ``n`` scored episodes with their tool counters, as ``trainer.mode=fully_async`` buffers them."""

    episodes: list[Episode]
    stats: ToolStats
    reward_errors: int

    @property
    def samples(self) -> list[Episode]:
        """The group's samples (each has ``versions``, as a single-turn ``Sample`` does)."""
        return self.episodes


class EpisodeCollector:
    def __init__(self, cfg: RunConfig, client: RolloutClient, task: Task, tokenizer) -> None:
        self.cfg, self.client, self.task, self.tokenizer = cfg, client, task, tokenizer
        self.tools = resolve_tools(tool_entries(cfg.agent, task))
        self.reward_ref = cfg.task.reward or getattr(task, "reward_ref", "")
        r = cfg.rollout
        self.framing = make_framing(tokenizer, cfg.task.chat_template, cfg.task.system_prompt, tool_schemas(self.tools))
        self.tool_format = cfg.agent.tool_format
        if self.tool_format == "auto":
            self.tool_format = "hermes" if self.framing.kind == "chat_template" else "plain"
        task_stop = getattr(task, "stop", []) if self.tool_format == "plain" else []
        self.stop = list(r.stop) + [s for s in task_stop if s not in r.stop]
        self.sampling = SamplingSpec.of(cfg.sampling, n=1, stop=self.stop)
        self.max_total_tokens = min(cfg.agent.max_total_tokens, r.max_model_len)
        self._pools: tuple[WorkerPool | None, WorkerPool | None] | None = None
        self.reward_model = make_reward_model(cfg.task.reward_model, cfg.rollout.auth_token)
        """``task.reward_model``: scores every episode's transcript after the prompt, once per step."""
        self._starting: asyncio.Lock | None = None
        self.openenv = None
        if cfg.task.name == "openenv":
            from rlx.agent.openenv import OpenEnvSessions

            self.openenv = OpenEnvSessions(cfg.agent.openenv)

    async def pools(self) -> tuple[WorkerPool | None, WorkerPool | None]:
        """(tool pool, reward pool), started on first use in the running event loop."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._pools is None:
                a = self.cfg.agent
                tools = (
                    WorkerPool(
                        "tool",
                        a.tool_workers,
                        a.tool_timeout_s,
                        a.tool_memory_mb,
                        a.max_tool_output_chars,
                        a.max_worker_output_bytes,
                    )
                    if self.tools
                    else None
                )
                rewards = (
                    WorkerPool(
                        "reward",
                        a.reward_workers,
                        a.reward_timeout_s,
                        a.tool_memory_mb,
                        max_log_bytes=a.max_worker_output_bytes,
                    )
                    if self.reward_ref
                    else None
                )
                await asyncio.gather(*(p.start() for p in (tools, rewards) if p is not None))
                self._pools = (tools, rewards)
        return self._pools

    async def close(self) -> None:
        if self._pools is not None:
            await asyncio.gather(*(p.close() for p in self._pools if p is not None))
            self._pools = None

    async def episodes(
        self, problems: list[Problem], sampling: SamplingSpec, n: int, seed: int | None, first_index: int = 0
    ) -> tuple[list[Episode], ToolStats, int]:
        """``n`` scored episodes per problem (problem-major), the tool counters and the reward errors; problem ``i``
        is seeded as the step's problem ``first_index + i``."""
        tool_pool, reward_pool = await self.pools()
        stats, reward_errors = ToolStats(), [0]

        async def one(index: int, problem: Problem, sample: int) -> Episode:
            turn_seed = None
            if seed is not None:
                turn_seed = ((seed * MAX_PROMPTS_PER_STEP + index) * n + sample) * self.cfg.agent.max_turns
            spec = sampling if turn_seed is None else msgspec.structs.replace(sampling, seed=turn_seed)
            chat = self.framing.kind == "chat_template"
            env = (
                self.openenv.env(chat)
                if self.openenv
                else ToolEnv(self.tools, tool_pool, self.tool_format, stats, self.task, chat=chat)
            )
            with tracer.span("agent.episode", problem=problem.id, sample=sample) as span:
                try:
                    episode = await run_episode(
                        self.client,
                        env,
                        problem,
                        self.framing,
                        spec,
                        self.cfg.agent.max_turns,
                        self.max_total_tokens,
                        self.cfg.rollout.request_timeout_s,
                    )
                finally:
                    if hasattr(env, "close"):
                        await env.close()
                episode.correct = bool(self.task.is_correct(episode.final_text, problem))
                episode.reward = await self._reward(episode, problem, reward_pool, reward_errors)
                span.set(turns=len(episode.turns), reward=episode.reward, done_reason=episode.done_reason)
            return episode

        done = await asyncio.gather(*(one(first_index + i, p, j) for i, p in enumerate(problems) for j in range(n)))
        return list(done), stats, reward_errors[0]

    async def _reward(self, episode: Episode, problem: Problem, pool: WorkerPool | None, errors: list[int]) -> float:
        if episode.env_reward is not None:
            return float(episode.env_reward)
        if pool is None:
            return float(self.task.reward(episode.final_text, problem))
        with tracer.span("agent.reward"):
            result = await pool.call(self.reward_ref, episode.final_text, problem.answer)
        if result.ok and isinstance(result.value, Real) and math.isfinite(result.value):
            return float(result.value)
        errors[0] += 1
        return 0.0

    async def group(self, problem: Problem, seed: int, index: int) -> EpisodeGroup:
        """The ``n`` episodes of problem ``index`` of a step seeded ``seed``, as ``collect`` draws them."""
        return EpisodeGroup(*await self.episodes([problem], self.sampling, self.cfg.rollout.n, seed, index))

    async def collect(self, problems: list[Problem], seed: int):
        start = time.perf_counter()
        with tracer.span("agent.collect", prompts=len(problems)):
            episodes, stats, reward_errors = await self.episodes(problems, self.sampling, self.cfg.rollout.n, seed)
        return await self.collected(problems, episodes, stats, reward_errors, time.perf_counter() - start)

    async def collected(
        self, problems: list[Problem], episodes: list[Episode], stats: ToolStats, reward_errors: int, elapsed: float
    ):
        """The ``Collected`` samples and metrics of ``n`` episodes per problem (problem-major), generated in
        ``elapsed``."""
        from rlx.orchestrator.collector import Collected

        rows = [e.row() for e in episodes]
        per_episode = [p for p in problems for _ in range(self.cfg.rollout.n)]
        model_metrics = await self._score_with_model(episodes, rows, per_episode)
        rewards = [e.reward for e in episodes]
        policy_tokens = [sum(len(t.token_ids) for t in e.turns) for e in episodes]
        metrics = {
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "accuracy": sum(e.correct for e in episodes) / len(episodes),
            "response_len_mean": statistics.fmean(policy_tokens),
            "tokens_per_s": sum(policy_tokens) / max(elapsed, 1e-9),
            "time_generate": elapsed,
            **episode_metrics(episodes, stats, reward_errors),
            **model_metrics,
        }
        samples = [
            Sample.of(prompt, completion, logp, reward, loss_mask=mask)
            for (prompt, completion, logp, mask), reward in zip(rows, rewards, strict=True)
        ]
        return Collected(samples, metrics, [e.final_text for e in episodes])

    async def _score_with_model(self, episodes: list[Episode], rows, problems: list[Problem]) -> dict[str, float]:
        """Mix ``task.reward_model``'s scores into the episodes' rewards; its metrics (none without one)."""
        if self.reward_model is None:
            return {}
        transcripts = [self.tokenizer.decode(r[1], skip_special_tokens=True) for r in rows]
        with tracer.span("reward_model", samples=len(episodes)):
            scored = await score_step(
                self.reward_model, [p.prompt for p in problems], transcripts, [p.answer for p in problems]
            )
        for episode, score in zip(episodes, scored.scores, strict=True):
            episode.reward = mix(episode.reward, score, self.cfg.task.reward_model.weight)
        return scored.metrics

    async def evaluate(self, problems: list[Problem]) -> float:
        """Accuracy of whole episodes (tools included) on ``problems``: greedy, or sampled with fixed seeds
        (``trainer.eval_temperature``)."""
        if not problems:
            return float("nan")
        temperature = self.cfg.trainer.eval_temperature
        spec = msgspec.structs.replace(self.sampling, temperature=temperature)
        with tracer.span("eval", prompts=len(problems)):
            episodes, _, _ = await self.episodes(problems, spec, 1, seed=EVAL_SEED if temperature > 0 else None)
        return sum(e.correct for e in episodes) / len(episodes)


def episode_metrics(episodes: list[Episode], stats: ToolStats, reward_errors: int) -> dict[str, float]:
    return {
        "turns_per_episode": statistics.fmean(len(e.turns) for e in episodes),
        "tool_calls_per_episode": stats.calls / len(episodes),
        # no calls (a task without tools, or a step that called none): no rate, which metrics.jsonl writes as
        # null and the console leaves off, rather than a success rate of 0
        "tool_call_success_rate": stats.ok / stats.calls if stats.calls else math.nan,
        "tool_errors": float(stats.errors),
        "tool_timeouts": float(stats.timeouts),
        "reward_errors": float(reward_errors),
    }
