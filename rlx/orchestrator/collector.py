"""Turn prompts into a scored training batch, and measure held-out accuracy.

``Collector.collect`` sends a step's prompts to the rollout servers (``n`` samples each),
scores every completion with the task's reward, and returns the step's ``Sample``s (token ids,
the engine's own logprobs and, where the server recorded them, the version of each token); the
trainer pads them into its batch. ``Collector.evaluate`` generates greedily on the held-out split.
It leaves out advantages and anything that needs the trainer's model.

Rewards are scored as groups finish, while the rest of the step still generates: each group's
samples in a thread off the event loop (``task.reward_workers`` groups at once), each sample's
reward a ``reward`` span in the trace with its duration. One group's scoring that has not returned
after ``task.reward_timeout_s`` stops the run with the reward function's stack in the log.
``time_reward`` is the seconds spent in reward calls, summed over the step's samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import msgspec
import torch

from rlx.config.schema import RunConfig
from rlx.orchestrator.episodes import EpisodeCollector, is_multi_turn
from rlx.rollout.client import RolloutClient
from rlx.rollout.protocol import PromptResult, SamplingSpec
from rlx.store.base import Sample, routes_from_bytes
from rlx.tasks import Problem, Task
from rlx.tasks.reward_models import Scored, make_reward_model, mix, score_step
from rlx.trace import tracer


class RewardTimeout(RuntimeError):
    """The reward function ran past ``task.reward_timeout_s`` on one step."""


MAX_PROMPTS_PER_STEP = 1 << 20


@dataclass
class GroupRewards:
    """The task reward and correctness of each sample of one group, and the seconds the reward calls took."""

    rewards: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    seconds: float = 0.0


async def run_off_loop(fn, args: tuple, limit_s: float, timeout_message):
    """``fn(*args)`` in a daemon thread (the caller's trace context with it): a call that hangs leaves the event loop
    free, and one that has not returned after ``limit_s`` (0 = no limit) raises ``RewardTimeout`` with
    ``timeout_message(limit_s)`` and the thread's stack."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            result, error = context.run(fn, *args), None
        except BaseException as exc:  # noqa: BLE001 - raised again in the loop, as if called there
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed while this scored (the run stopped): nobody waits
            loop.call_soon_threadsafe(
                lambda: done.done() or (done.set_exception(error) if error else done.set_result(result))
            )

    thread = threading.Thread(target=run, name="rlx-reward", daemon=True)
    thread.start()
    try:
        return await asyncio.wait_for(asyncio.shield(done), limit_s or None)
    except TimeoutError:
        frame = sys._current_frames().get(thread.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(it has just returned)\n"
        timeout = RewardTimeout(timeout_message(limit_s))
        timeout.add_note(f"where the reward function's thread is now:\n{stack.rstrip()}")
        raise timeout from None


@dataclass
class Collected:
    """A step's samples (problem-major, ``rollout.n`` per group), its metrics and each sample's text."""

    samples: list[Sample]
    metrics: dict[str, float]
    completions: list[str]


class Collector:
    def __init__(self, cfg: RunConfig, client: RolloutClient, task: Task) -> None:
        self.cfg = cfg
        self.client = client
        self.task = task
        self._score_lock = asyncio.Lock()
        self._reward_slots = asyncio.Semaphore(cfg.task.reward_workers)
        self.sampling = SamplingSpec.of(cfg.sampling)
        self.agent = None
        """Multi-turn tasks (tools) run as episodes (``rlx.agent``)."""
        if is_multi_turn(cfg.agent, task):
            from rlx.trainer.model import load_tokenizer

            self.agent = EpisodeCollector(cfg, client, task, load_tokenizer(cfg.model.path))
        self.reward_model = (
            make_reward_model(cfg.task.reward_model, cfg.rollout.auth_token) if self.agent is None else None
        )
        """``task.reward_model``, scored over a step's samples at once (episodes score in ``EpisodeCollector``)."""

    async def collect(self, problems: list[Problem], seed: int) -> Collected:
        if self.agent is not None:
            return await self.agent.collect(problems, seed)
        start = time.perf_counter()

        async def scored_group(index: int, problem: Problem) -> tuple[PromptResult, GroupRewards]:
            result = await self.generate_group(problem, seed, index, together=len(problems))
            return result, await self.group_rewards(problem, result)

        done = await gather_or_cancel(scored_group(i, p) for i, p in enumerate(problems))
        elapsed = time.perf_counter() - start
        results = [result for result, _ in done]
        return await self.score_off_loop(
            problems, results, elapsed, await self.model_scores(problems, results), [rewards for _, rewards in done]
        )

    async def group_rewards(self, problem: Problem, result: PromptResult) -> GroupRewards:
        """The reward and correctness of each sample of one group, scored in a thread (one of
        ``task.reward_workers``)."""
        async with self._reward_slots:
            return await run_off_loop(
                self.rewards, (problem, result), self.cfg.task.reward_timeout_s, self._timeout_message
            )

    def rewards(self, problem: Problem, result: PromptResult) -> GroupRewards:
        scored = GroupRewards()
        for j, sample in enumerate(result.samples):
            start = time.perf_counter()
            with tracer.span("reward", problem=problem.id, sample=j) as span:
                reward = float(self.task.reward(sample.text, problem))
                span.set(reward=reward)
            scored.rewards.append(reward)
            scored.correct.append(bool(self.task.is_correct(sample.text, problem)))
            scored.seconds += time.perf_counter() - start
        return scored

    def _timeout_message(self, limit: float) -> str:
        return (
            f"the reward function ({self.cfg.task.reward or 'task ' + self.cfg.task.name}) has not returned "
            f"after task.reward_timeout_s={limit:g} s scoring one step (the log shows where it is); raise "
            "task.reward_timeout_s if it is only slow"
        )

    async def model_scores(self, problems: list[Problem], results: list[PromptResult]) -> Scored | None:
        """``task.reward_model``'s score of every sample (problem-major); None without a reward model."""
        if self.reward_model is None:
            return None
        pairs = [(p, s.text) for p, r in zip(problems, results, strict=True) for s in r.samples]
        with tracer.span("reward_model", samples=len(pairs)):
            return await score_step(
                self.reward_model, [p.prompt for p, _ in pairs], [t for _, t in pairs], [p.answer for p, _ in pairs]
            )

    async def score_off_loop(self, *args) -> Collected:
        """``score`` (the user's reward function, where a group was not scored yet) in a daemon thread, one call at
        a time: a reward that hangs leaves the event loop free, so Ctrl-C and SIGTERM still stop the run, and one
        that has not returned after ``task.reward_timeout_s`` stops it with its stack in the log."""
        async with self._score_lock:
            return await run_off_loop(self.score, args, self.cfg.task.reward_timeout_s, self._timeout_message)

    async def generate_group(self, problem: Problem, seed: int, index: int, together: int = 0):
        """The ``n`` samples of problem ``index`` of a step seeded ``seed`` (one group), as ``collect`` draws them:
        a ``PromptResult``, or an ``EpisodeGroup`` of scored episodes for a multi-turn task; ``together``: groups
        requested at once with this one (``RolloutClient.generate``)."""
        if self.agent is not None:
            return await self.agent.group(problem, seed, index)
        results = await self.client.generate(
            [problem.prompt], self._seeded(seed, index), timeout_s=self.cfg.rollout.request_timeout_s, together=together
        )
        return results[0]

    def score(
        self,
        problems: list[Problem],
        results: list[PromptResult],
        time_generate: float,
        model: Scored | None = None,
        scored: list[GroupRewards] | None = None,
    ) -> Collected:
        """Rewards, metrics and the samples of one ``PromptResult`` per problem; ``scored`` holds each group's
        rewards where they were scored as it finished (else they are scored here); ``model`` holds the reward
        model's score of each sample (problem-major), mixed in by ``task.reward_model.weight``."""
        scored = scored or [self.rewards(problem, result) for problem, result in zip(problems, results, strict=True)]
        samples, texts, correct = [], [], []
        for result, group in zip(results, scored, strict=True):
            prompt = torch.tensor(result.prompt_token_ids, dtype=torch.long)
            for sample, scored_reward, right in zip(result.samples, group.rewards, group.correct, strict=True):
                reward = scored_reward
                if model is not None:
                    reward = mix(scored_reward, model.scores[len(samples)], self.cfg.task.reward_model.weight)
                routes = routes_from_bytes(sample.routes, sample.routes_shape, sample.routes_dtype)
                samples.append(
                    Sample.of(
                        prompt, sample.token_ids, sample.logprobs, reward, versions=sample.versions, routes=routes
                    )
                )
                texts.append(sample.text)
                correct.append(right)
        rewards = [s.reward for s in samples]
        lengths = [len(s.completion_ids) for s in samples]
        metrics = {
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "accuracy": sum(correct) / len(correct),
            "response_len_mean": statistics.fmean(lengths),
            "tokens_per_s": sum(lengths) / max(time_generate, 1e-9),
            "time_generate": time_generate,
            "time_reward": sum(group.seconds for group in scored),
            **(model.metrics if model is not None else {}),
        }
        return Collected(samples, metrics, texts)

    def _seeded(self, seed: int, index: int) -> SamplingSpec:
        """Prompt ``index``'s sampling: its own seed, spaced by ``n`` because the engine seeds the
        ``n`` samples of one request ``seed, seed + 1, ...``. One seed for every prompt would draw
        sample ``j`` of every prompt from the same random stream, correlating the whole batch."""
        spaced = (seed * MAX_PROMPTS_PER_STEP + index) * self.sampling.n
        return msgspec.structs.replace(self.sampling, seed=spaced)

    async def evaluate(self, problems: list[Problem]) -> dict[str, float]:
        """Held-out metrics on ``problems`` (``rlx.orchestrator.evaluate``, which `rlx eval` runs too): accuracy,
        greedy or sampled (``trainer.eval_temperature``), and with ``task.eval_k`` > 1 pass@1, pass@k and maj@k."""
        if self.agent is not None:
            return {"accuracy": await self.agent.evaluate(problems)}
        from rlx.orchestrator.evaluate import evaluate_prompts

        c = self.cfg
        return await evaluate_prompts(
            self.client,
            self.task,
            problems,
            c.sampling,
            c.trainer.eval_temperature,
            c.task.eval_k,
            c.rollout.request_timeout_s,
        )


async def gather_or_cancel(coros) -> list:
    """Every result, or the first failure after the others are cancelled and awaited: a second failing reward
    would otherwise surface as a traceback when the run's event loop shuts down."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
