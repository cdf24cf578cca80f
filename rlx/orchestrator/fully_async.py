"""trainer.mode=fully_async: generation never stops; each step trains on whole prompt groups as they finish.

A producer keeps prompt groups (one prompt, ``rollout.n`` samples) in flight on the rollout servers and
puts each finished group into a ``GroupBuffer``; a step takes ``prompts_per_step`` groups from it. For a
multi-turn task a group is ``rollout.n`` whole episodes (``rlx.orchestrator.episodes.EpisodeGroup``), tool
calls and rewards included, each turn's tokens with the version that sampled them, so an episode that
spans syncs is as stale as its oldest token. A reward model (``task.reward_model``) scores a step's
groups when the step takes them. The
controller's weight syncs happen while requests are in flight (pause keeping them, sync, a resume naming
the new policy version), so a long sample spans versions (a partial rollout) and each token carries the
version and the logprob that sampled it (``Sample.versions``, ``Sample.logprobs``); the loss takes PPO's
ratio against each token's own behaviour logprob (``bypass``, unless ``algorithm.rollout_correction``
says otherwise).

Staleness of a sample (or episode) = the trainer's policy version minus the version of its oldest token. The producer
starts a group only while started-but-untrained groups stay within ``max_staleness + 1`` steps of the
trainer (AReaL's bound), and a group whose oldest token is more than ``trainer.max_staleness`` versions
behind when a step takes its batch is dropped and its prompt generated again (``samples_dropped_stale``).
The buffer's interface (put, take a step's worth, drop the stale) is narrow so it can sit on a shared
sample store instead.

Resume: a checkpoint records the data position before the oldest prompt not yet trained on; a resumed
run generates what was in flight or buffered again (and draws prompts trained after it once more).
Off-policy metrics per step: ``staleness_mean`` / ``staleness_max`` / ``staleness_hist_*``,
``partial_rollout_frac`` (samples spanning versions), ``samples_dropped_stale`` and
``stale_dropped_frac`` (the share of finished samples discarded as too stale, over the run),
``time_wait_batch`` (the step waiting for groups) and ``time_producer_idle`` (the producer waiting for a
new policy before it may start more). It leaves out several groups per request.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from dataclasses import dataclass

from rlx.agent.env import ToolStats
from rlx.config.schema import RunConfig
from rlx.orchestrator.collector import Collected, Collector, GroupRewards
from rlx.orchestrator.episodes import EpisodeGroup
from rlx.rollout.protocol import PromptResult
from rlx.tasks import DataStream, Problem
from rlx.trace import tracer


@dataclass
class Group:
    """One prompt's finished samples, with where it came from."""

    problem: Problem
    result: PromptResult | EpisodeGroup
    order: int
    """Draw order of the prompt (a prompt generated again keeps its first draw's place)."""
    drawn_state: dict
    """The data position before the prompt was first drawn."""
    started_version: int
    """The trainer's version when the request went out; the version of a sample without per-token versions."""
    rewards: GroupRewards | None = None
    """The samples' task rewards, scored as the group finished (episodes carry their own)."""

    def sample_oldest(self) -> list[int]:
        """The version of each sample's oldest token."""
        return [min(s.versions) if s.versions else self.started_version for s in self.result.samples]

    @property
    def oldest_version(self) -> int:
        return min(self.sample_oldest(), default=self.started_version)


class GroupBuffer:
    """Finished groups waiting to be trained on: ``put`` as each finishes, ``take`` a step's worth."""

    def __init__(self) -> None:
        self._groups: list[Group] = []

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: Group) -> None:
        self._groups.append(group)

    def take(self, count: int, version: int, max_staleness: int) -> tuple[list[Group], list[Group]]:
        """``count`` groups at most ``max_staleness`` versions behind ``version`` (earliest drawn first), or
        none while fewer are ready; and the groups older than that, removed for good."""
        stale = [g for g in self._groups if version - g.oldest_version > max_staleness]
        fresh = sorted((g for g in self._groups if g not in stale), key=lambda g: g.order)
        taken = fresh[:count] if len(fresh) >= count else []
        self._groups = fresh[len(taken) :]
        return taken, stale

    def oldest(self) -> Group | None:
        return min(self._groups, key=lambda g: g.order, default=None)


class FullyAsyncRollout:
    """The producer and the buffer; the controller calls ``next_batch`` once per step."""

    def __init__(self, cfg: RunConfig, collector: Collector, stream: DataStream, version: int) -> None:
        t = cfg.trainer
        self.cfg, self.collector, self.stream = cfg, collector, stream
        self.group_size, self.max_staleness = t.prompts_per_step, t.max_staleness
        self.base_version = self.version = version
        self.groups_needed = (t.total_steps - version) * self.group_size  # none are started past the last step
        self.buffer = GroupBuffer()
        self._in_flight: dict[int, tuple[Problem, dict]] = {}  # order -> (problem, drawn_state)
        self._again: deque[tuple[int, Problem, dict]] = deque()  # stale groups' prompts, generated again
        self._orders = 0
        self._attempts = 0  # requests sent; a prompt generated again gets a new seed
        self._trained = 0  # groups taken for training
        self._trained_samples = 0
        self.dropped_samples = 0
        self._idle_s = 0.0
        self._failure: BaseException | None = None
        self._changed = asyncio.Event()  # room for the producer, or groups for the consumer
        self._tasks: set[asyncio.Task] = set()
        self._producer = asyncio.create_task(self._produce())
        self._last_take = time.perf_counter()

    def _room(self) -> bool:
        return self._room_left() > 0

    def _room_left(self) -> int:
        """Groups the producer may start now."""
        started = self._trained + len(self._in_flight) + len(self.buffer)
        bound = (self.version - self.base_version + self.max_staleness + 1) * self.group_size
        return max(0, min(bound, self.groups_needed) - started)

    async def _produce(self) -> None:
        while True:
            if not self._room():
                started = time.perf_counter()
                with tracer.span("producer.idle", in_flight=len(self._in_flight), buffered=len(self.buffer)):
                    while not self._room():
                        self._changed.clear()
                        await self._changed.wait()
                self._idle_s += time.perf_counter() - started
            burst = self._room_left()  # every group there is room for, sent at once and told so
            for _ in range(burst):
                order, problem, drawn_state = self._draw()
                self._in_flight[order] = (problem, drawn_state)
                task = asyncio.create_task(self._generate(order, problem, drawn_state, burst))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(0)

    def _draw(self) -> tuple[int, Problem, dict]:
        if self._again:
            return self._again.popleft()
        drawn_state = self.stream.state()
        problem = self.stream.next_batch(1)[0]
        self._orders += 1
        return self._orders - 1, problem, drawn_state

    async def _generate(self, order: int, problem: Problem, drawn_state: dict, together: int = 0) -> None:
        started_version = self.version
        attempt, self._attempts = self._attempts, self._attempts + 1
        seed = self.cfg.trainer.seed * 1_000_003 + 1 + attempt // self.group_size  # sync mode's seed of that step
        try:
            result = await self.collector.generate_group(problem, seed, attempt % self.group_size, together)
            rewards = None if isinstance(result, EpisodeGroup) else await self.collector.group_rewards(problem, result)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the step waiting for groups raises it
            self._failure = exc
        else:
            self.buffer.put(Group(problem, result, order, drawn_state, started_version, rewards))
        finally:
            self._in_flight.pop(order, None)
            self._changed.set()

    async def next_batch(self, version: int) -> Collected:
        """The next step's groups, trained by weights of policy ``version``; waits until enough are ready."""
        self.version = version
        self._changed.set()  # a newer version makes room for the producer
        waited = time.perf_counter()
        with tracer.span("consumer.wait", version=version) as span:
            while True:
                if self._failure is not None:
                    raise self._failure
                taken, stale = self.buffer.take(self.group_size, version, self.max_staleness)
                self._drop(stale)
                if taken:
                    break
                self._changed.clear()
                await self._changed.wait()
            span.set(buffered=len(self.buffer), dropped=self.dropped_samples)
        now = time.perf_counter()
        self._trained += len(taken)
        self._trained_samples += sum(len(g.result.samples) for g in taken)
        self._changed.set()
        collected = await self._scored(taken, now - self._last_take)
        collected.metrics.update(self._metrics(taken, version, now - waited))
        self._last_take = now
        return collected

    async def _scored(self, taken: list[Group], elapsed: float) -> Collected:
        """The batch of ``taken``, scored as each group finished (with the reward model's scores mixed in now, if
        there is one)."""
        problems = [g.problem for g in taken]
        if isinstance(taken[0].result, EpisodeGroup):
            groups = [g.result for g in taken]
            stats = ToolStats(
                *(sum(getattr(g.stats, f) for g in groups) for f in ("calls", "ok", "errors", "timeouts"))
            )
            return await self.collector.agent.collected(
                problems, [e for g in groups for e in g.episodes], stats, sum(g.reward_errors for g in groups), elapsed
            )
        results = [g.result for g in taken]
        return await self.collector.score_off_loop(
            problems, results, elapsed, await self.collector.model_scores(problems, results), [g.rewards for g in taken]
        )

    def _drop(self, stale: list[Group]) -> None:
        for group in stale:
            self.dropped_samples += len(group.result.samples)
            self._again.append((group.order, group.problem, group.drawn_state))
            tracer.event(
                "group.dropped_stale", order=group.order, oldest_version=group.oldest_version, version=self.version
            )

    def _metrics(self, taken: list[Group], version: int, waited_s: float) -> dict[str, float]:
        staleness = [version - v for g in taken for v in g.sample_oldest()]
        spans = [len(set(s.versions)) > 1 for g in taken for s in g.result.samples]
        metrics = {
            "staleness_mean": statistics.fmean(staleness),
            "staleness_max": float(max(staleness)),
            "partial_rollout_frac": sum(spans) / len(spans),
            "samples_dropped_stale": float(self.dropped_samples),
            "stale_dropped_frac": self.dropped_samples / max(1, self.dropped_samples + self._trained_samples),
            "buffer_groups": float(len(self.buffer)),
            "groups_in_flight": float(len(self._in_flight)),
            "time_wait_batch": waited_s,
            "time_producer_idle": self._idle_s,
        }
        for lag in range(self.max_staleness + 1):
            metrics[f"staleness_hist_{lag}"] = float(staleness.count(lag))
        self._idle_s = 0.0
        return metrics

    def data_state(self) -> dict:
        """The data position before the earliest drawn prompt not trained on yet."""
        pending = [state for _, state in self._in_flight.values()] + [state for _, _, state in self._again]
        orders = [order for order in self._in_flight] + [order for order, _, _ in self._again]
        oldest = self.buffer.oldest()
        if oldest is not None:
            pending.append(oldest.drawn_state)
            orders.append(oldest.order)
        return pending[orders.index(min(orders))] if orders else self.stream.state()

    def close(self) -> None:
        self._producer.cancel()
        for task in list(self._tasks):
            task.cancel()
