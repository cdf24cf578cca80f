"""task.name=external: train on episodes an outside agent drove through the servers' OpenAI endpoint.

The agent calls ``/v1/chat/completions`` on `rlx rollout-serve --openai-port` with an episode id
and finishes the episode with its reward (``rlx.rollout.openai_http``). ``ExternalCollector``
makes each step's batch from ``trainer.prompts_per_step`` finished episodes, taken from the
servers with ``protocol.TakeEpisodes`` (oldest first), waiting up to ``rollout.request_timeout_s``
for them. A recorded episode becomes ``rlx.rollout.agent.episode.Episode`` rows: a turn whose
prompt starts with everything before it (the endpoint keeps follow-ups token-in/token-out)
continues the row, the new prompt tokens entering as an observation (loss mask 0); a turn whose
prompt does not (the agent rewrote the history) starts a new row with the same reward. Weight syncs
go on as in any run, so the agent's next requests see the new weights.

The agent, not rlx, decides what to sample, so there are no prompt groups: the run needs
``rollout.n=1`` and an advantage without groups (reinforce_pp or gae). The task's one "problem"
is a placeholder that keeps the data stream, checkpoints and resume as they are for other tasks.
Left out: held-out evaluation (eval accuracy is NaN) and ordering episodes into groups.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

from rlx.config.errors import ConfigError
from rlx.engine.batch import build_batch
from rlx.rollout import protocol as p
from rlx.rollout.agent.episode import Episode, Turn
from rlx.rollout.client import RolloutClient
from rlx.rollout.tasks.base import Problem
from rlx.trace import tracer

GROUPLESS_ADVANTAGES = ("reinforce_pp", "gae")
POLL_INTERVAL_S = 0.2
WAIT_NOTE_EVERY_S = 30.0


@dataclass
class External:
    train: list[Problem] = field(default_factory=lambda: [Problem(id=0, prompt="", answer="")])
    eval: list[Problem] = field(default_factory=list)
    name: str = field(default="external", init=False)

    def reward(self, completion: str, problem: Problem) -> float:
        raise NotImplementedError("external episodes carry the reward their agent sent with the finish request")

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return False


def check_config(cfg) -> None:
    """The run settings an external task needs; raises ConfigError naming the fix."""
    if cfg.rollout.n != 1 or cfg.algorithm.advantage not in GROUPLESS_ADVANTAGES:
        raise ConfigError(f"task.name=external with rollout.n={cfg.rollout.n} and algorithm.advantage="
                          f"{cfg.algorithm.advantage}: the agent's episodes come in no groups; set rollout.n=1 and "
                          "algorithm.advantage=reinforce_pp (whitened over the step) or gae")
    if cfg.trainer.mode == "fully_async":
        raise ConfigError("task.name=external with trainer.mode=fully_async: the agent drives its own episodes, and "
                          "fully_async generates single-turn groups itself; set trainer.mode=sync or one_step_off")
    if cfg.rollout.servers_to_launch and not cfg.rollout.openai_port:
        raise ConfigError("task.name=external: the launched rollout servers need an OpenAI endpoint for the agent; "
                          "set rollout.openai_port (server i listens on openai_port + i)")


def episode_rows(recorded: p.RecordedEpisode) -> list[Episode]:
    """One ``Episode`` per run of turns that extend each other token for token."""
    rows: list[Episode] = []
    context: list[int] = []
    for turn in recorded.turns:
        prompt = turn.prompt_token_ids
        if rows and prompt[:len(context)] == context:
            rows[-1].turns[-1].observation_ids = prompt[len(context):]
        else:
            rows.append(Episode(prompt_ids=list(prompt), reward=recorded.reward))
        rows[-1].turns.append(Turn(token_ids=list(turn.token_ids), logprobs=list(turn.logprobs)))
        context = rows[-1].context()
    return rows


class ExternalCollector:
    """``Collector``'s interface over finished external episodes (see the module docstring)."""

    def __init__(self, cfg, client: RolloutClient, pad_id: int, note=lambda text: None) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.client = client
        self.pad_id = pad_id
        self.note = note  # a console line: what the run waits for, when it waits

    async def take(self, wanted: int) -> list[p.RecordedEpisode]:
        """``wanted`` finished episodes from the live servers, waiting for the agent within the request timeout;
        a wait is said on the console when it starts and every WAIT_NOTE_EVERY_S after."""
        taken: list[p.RecordedEpisode] = []
        started = time.monotonic()
        deadline, next_note = started + self.cfg.rollout.request_timeout_s, started
        while True:
            for index in self.client.live_indices():
                if len(taken) < wanted:
                    reply = await self.client.call(index, p.TakeEpisodes(max_episodes=wanted - len(taken)))
                    taken += reply.episodes
            if len(taken) == wanted:
                return taken
            if time.monotonic() >= next_note:
                self.note(self._waiting(len(taken), wanted, time.monotonic() - started))
                next_note = time.monotonic() + WAIT_NOTE_EVERY_S
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"task.name=external: {len(taken)} of {wanted} episodes finished within "
                    f"{self.cfg.rollout.request_timeout_s:g} s (rollout.request_timeout_s); the agent must finish "
                    "episodes with POST /v1/episodes/ID/finish on the servers' OpenAI endpoint")
            await asyncio.sleep(POLL_INTERVAL_S)

    def _waiting(self, have: int, wanted: int, waited_s: float) -> str:
        from rlx.rollout.openai_http import openai_url

        r = self.cfg.rollout
        launched = range(r.servers_to_launch) if r.openai_port else range(0)
        urls = [openai_url(r.openai_host, r.openai_port + i) for i in launched]
        where = ", ".join(urls) if urls else "the servers' OpenAI endpoints"
        return (f"waiting for the agent: {have} of {wanted} episodes finished ({waited_s:.0f} s of "
                f"rollout.request_timeout_s={r.request_timeout_s:g}); it sends chat completions with an X-Episode-Id "
                f"header to {where} and finishes each episode with POST .../v1/episodes/ID/finish {{\"reward\": R}}")

    async def collect(self, problems: list[Problem], seed: int):
        from rlx.rollout.collector import Collected

        start = time.perf_counter()
        with tracer.span("episodes.take", wanted=len(problems)):
            recorded = await self.take(len(problems))
        time_generate = time.perf_counter() - start
        rows = [row for episode in recorded for row in episode_rows(episode)]
        prompts, completions, logps, masks, rewards = [], [], [], [], []
        for row in rows:
            prompt, completion, logp, mask = row.row()
            prompts.append(prompt)
            completions.append(completion)
            logps.append(logp)
            masks.append(mask)
            rewards.append(row.reward)
        episode_rewards = [e.reward for e in recorded]
        metrics = {
            "reward_mean": statistics.fmean(episode_rewards),
            "reward_std": statistics.pstdev(episode_rewards),
            "episodes": float(len(recorded)),
            "episode_rows": float(len(rows)),
            "episode_turns_mean": statistics.fmean(len(e.turns) for e in recorded),
            "response_len_mean": statistics.fmean(sum(m) for m in masks),
            "time_generate": time_generate,
        }
        batch = build_batch(prompts, completions, logps, rewards, self.pad_id, token_masks=masks)
        texts = [f"episode {e.id}: {len(e.turns)} turns, reward {e.reward:g}" for e in recorded]
        return Collected(batch, metrics, texts)

    async def evaluate(self, problems: list[Problem]) -> float:
        return float("nan")
