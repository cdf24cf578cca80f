"""task.name=external: train on episodes an outside agent drove through the servers' OpenAI endpoint.

The agent calls ``/v1/chat/completions`` on `rlx rollout-serve --openai-port` with an episode id
and finishes the episode with its reward (``rlx.rollout.openai_http``). ``ExternalCollector``
makes each step's batch from ``trainer.prompts_per_step`` finished episodes, taken from the
servers with ``protocol.TakeEpisodes`` (oldest first), waiting up to ``rollout.request_timeout_s``
for them. A recorded episode becomes ``rlx.agent.episode.Episode`` rows: a turn whose
prompt starts with everything before it (the endpoint keeps follow-ups token-in/token-out)
continues the row, the new prompt tokens entering as an observation (loss mask 0); a turn whose
prompt does not (the agent rewrote the history) starts a new row with the same reward. Weight syncs
go on as in any run, so the agent's next requests see the new weights.

Groups: with ``rollout.n=1`` every episode stands alone and the advantage must need no groups
(reinforce_pp or gae). With ``rollout.n`` > 1 (GRPO, RLOO, ...) a step takes ``prompts_per_step`` whole
groups of ``rollout.n`` episodes: the agent asks for ``n`` samples of one state (``n`` in its first
request) or names each episode's group (``X-Group-Id``), see ``rlx.rollout.openai_http``; one group's
episodes go through one server. A group's episodes must each be one token-in/token-out row: a group with
an episode whose history was rewritten is dropped (``groups_dropped_split``).

``trainer.mode=fully_async``: the agent is the producer and never waits for the trainer; a step drops
the groups (or episodes) whose oldest token is more than ``trainer.max_staleness`` versions behind the
trainer (``samples_dropped_stale``, ``stale_dropped_frac``) and logs ``staleness_mean`` /
``staleness_max`` of those it trains on. The task's one "problem" is a placeholder that keeps the data
stream, checkpoints and resume as they are for other tasks. Left out: held-out evaluation (eval
accuracy is NaN).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

from rlx.agent.episode import Episode, Turn
from rlx.config.errors import ConfigError
from rlx.config.schema import RunConfig
from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from rlx.store.base import Sample
from rlx.tasks.base import Problem
from rlx.trace import tracer

GROUPLESS_ADVANTAGES = ("reinforce_pp", "gae")
POLL_INTERVAL_S = 0.2
WAIT_NOTE_EVERY_S = 30.0


def check_config(cfg: RunConfig) -> None:
    """The run settings an external task needs (task.name=external; any other task needs none of them); raises
    ConfigError naming the fix."""
    if cfg.task.name != "external":
        return
    if cfg.rollout.n == 1 and cfg.algorithm.advantage not in GROUPLESS_ADVANTAGES:
        raise ConfigError(
            f"task.name=external with rollout.n=1 and algorithm.advantage={cfg.algorithm.advantage}: "
            "single episodes form no groups; set algorithm.advantage=reinforce_pp (whitened over the "
            "step) or gae, or rollout.n to the group size the agent asks for (n in its first request "
            "or an X-Group-Id header)"
        )
    if cfg.rollout.servers_to_launch and not cfg.rollout.openai_port:
        raise ConfigError(
            "task.name=external: the launched rollout servers need an OpenAI endpoint for the agent; "
            "set rollout.openai_port (server i listens on openai_port + i)"
        )


def episode_rows(recorded: p.RecordedEpisode) -> list[Episode]:
    """One ``Episode`` per run of turns that extend each other token for token."""
    rows: list[Episode] = []
    context: list[int] = []
    for turn in recorded.turns:
        prompt = turn.prompt_token_ids
        if rows and prompt[: len(context)] == context:
            rows[-1].turns[-1].observation_ids = prompt[len(context) :]
        else:
            rows.append(Episode(prompt_ids=list(prompt), reward=recorded.reward))
        rows[-1].turns.append(Turn(token_ids=list(turn.token_ids), logprobs=list(turn.logprobs)))
        context = rows[-1].context()
    return rows


def oldest_version(episode: p.RecordedEpisode) -> int:
    """The policy version of the episode's oldest token (a turn without per-token versions: its answer's version)."""
    return min(min(t.versions, default=t.weight_version) for t in episode.turns)


class ExternalCollector:
    """``Collector``'s interface over finished external episodes (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        client: RolloutClient,
        policy_version: Callable[[], int] = lambda: 0,
        note: Callable[[str], None] = lambda text: None,
    ) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.client = client
        self.note = note  # a console line: what the run waits for, when it waits
        self.policy_version = policy_version
        """The trainer's current policy version (fully_async drops what lags it by more than max_staleness)."""
        self.dropped = {"stale": 0, "split": 0, "trained": 0}

    async def take(self, wanted: int) -> list[list[p.RecordedEpisode]]:
        """``wanted`` groups of ``rollout.n`` finished episodes from the live servers, waiting for the agent within
        the request timeout; groups too stale (fully_async) or with a split episode are dropped on the way. A wait
        is said on the console when it starts and every WAIT_NOTE_EVERY_S after."""
        n = self.cfg.rollout.n
        groups: list[list[p.RecordedEpisode]] = []
        started = time.monotonic()
        deadline, next_note = started + self.cfg.rollout.request_timeout_s, started
        while True:
            for index in self.client.live_indices():
                if len(groups) < wanted:
                    reply = await self.client.call(index, p.TakeEpisodes((wanted - len(groups)) * n, n))
                    groups += [
                        g
                        for g in (reply.episodes[i : i + n] for i in range(0, len(reply.episodes), n))
                        if self._usable(g)
                    ]
            if len(groups) == wanted:
                return groups
            if time.monotonic() >= next_note:
                self.note(self._waiting(len(groups) * n, wanted * n, time.monotonic() - started))
                next_note = time.monotonic() + WAIT_NOTE_EVERY_S
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"task.name=external: {len(groups)} of {wanted} {'groups' if n > 1 else 'episodes'} finished "
                    f"within {self.cfg.rollout.request_timeout_s:g} s (rollout.request_timeout_s); the agent must "
                    "finish episodes with POST /v1/episodes/ID/finish on the servers' OpenAI endpoint"
                    + (
                        f", {n} per group (n={n} in an episode's first request, or an X-Group-Id header)"
                        if n > 1
                        else ""
                    )
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    def _waiting(self, have: int, wanted: int, waited_s: float) -> str:
        from rlx.rollout.openai_http import openai_url

        r = self.cfg.rollout
        launched = range(r.servers_to_launch) if r.openai_port else range(0)
        urls = [openai_url(r.openai_host, r.openai_port + i) for i in launched]
        where = ", ".join(urls) if urls else "the servers' OpenAI endpoints"
        return (
            f"waiting for the agent: {have} of {wanted} episodes finished ({waited_s:.0f} s of "
            f"rollout.request_timeout_s={r.request_timeout_s:g}); it sends chat completions with an X-Episode-Id "
            f'header to {where} and finishes each episode with POST .../v1/episodes/ID/finish {{"reward": R}}'
        )

    def _usable(self, group: list[p.RecordedEpisode]) -> bool:
        if len(group) > 1 and any(len(episode_rows(e)) > 1 for e in group):
            self.dropped["split"] += 1
            tracer.event("group.dropped_split", group=group[0].group)
            return False
        lag = self.policy_version() - min(oldest_version(e) for e in group)
        if self.cfg.trainer.mode == "fully_async" and lag > self.cfg.trainer.max_staleness:
            self.dropped["stale"] += len(group)
            tracer.event("group.dropped_stale", group=group[0].group or group[0].id, lag=lag)
            return False
        self.dropped["trained"] += len(group)
        return True

    async def collect(self, problems: list[Problem], seed: int):
        from rlx.orchestrator.collector import Collected

        start = time.perf_counter()
        with tracer.span("episodes.take", wanted=len(problems)):
            groups = await self.take(len(problems))
        time_generate = time.perf_counter() - start
        recorded = [e for g in groups for e in g]
        rows = [row for episode in recorded for row in episode_rows(episode)]
        samples = [
            Sample.of(prompt, completion, logp, row.reward, loss_mask=mask)
            for row in rows
            for prompt, completion, logp, mask in [row.row()]
        ]
        episode_rewards = [e.reward for e in recorded]
        metrics = {
            "reward_mean": statistics.fmean(episode_rewards),
            "reward_std": statistics.pstdev(episode_rewards),
            "episodes": float(len(recorded)),
            "episode_rows": float(len(rows)),
            "episode_turns_mean": statistics.fmean(len(e.turns) for e in recorded),
            "response_len_mean": statistics.fmean(float(s.loss_mask.sum()) for s in samples),
            "time_generate": time_generate,
            **self._off_policy_metrics(recorded),
        }
        texts = [f"episode {e.id}: {len(e.turns)} turns, reward {e.reward:g}" for e in recorded]
        return Collected(samples, metrics, texts)

    def _off_policy_metrics(self, recorded: list[p.RecordedEpisode]) -> dict[str, float]:
        # a server kept from an earlier run numbers its versions ahead of this run's: not fresher, so 0
        lags = [max(0, self.policy_version() - oldest_version(e)) for e in recorded]
        metrics = {"staleness_mean": statistics.fmean(lags), "staleness_max": float(max(lags))}
        if self.cfg.rollout.n > 1:
            metrics["groups_dropped_split"] = float(self.dropped["split"])
        if self.cfg.trainer.mode == "fully_async":
            stale = self.dropped["stale"]
            metrics["samples_dropped_stale"] = float(stale)
            metrics["stale_dropped_frac"] = stale / max(1, stale + self.dropped["trained"])
        return metrics

    async def evaluate(self, problems: list[Problem]) -> dict[str, float]:
        return {"accuracy": float("nan")}
