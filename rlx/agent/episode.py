"""The record of one multi-turn episode, kept as token ids (token-in/token-out).

An ``Episode`` is the first prompt's ids and then, in order, ``Turn`` records: each turn is
what the policy sampled (its exact token ids and the engine's logprob of each) followed by the
environment's observation ids (empty on the last turn). The conversation is never re-tokenised:
the prompt of turn k+1 is ``episode.context()`` = prompt ids + every earlier turn's sampled ids +
observation ids, so the trainer scores exactly the tokens the engine produced.

``Episode.row()`` lays the episode out as one training row: the first prompt is the prompt, and
everything after it (policy tokens and observations) is the "completion" region, with a loss
mask of 1 on policy tokens and 0 on observation tokens (context only). ``rlx.trainer.batch``'s
``build_batch(..., token_masks=...)`` takes these rows. A single-turn rollout is an episode of
one turn with no observation.

Recorded episodes (e.g. from an OpenAI-compatible endpoint) can be built directly:
``Episode(prompt_ids=[...], turns=[Turn(token_ids=[...], logprobs=[...], observation_ids=[...])])``.
Text fields (``text``, ``observation``) are for logs and parsing only; the ids are the truth.
Left out: branching (tree) episodes and per-turn rewards; the reward is one number per episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCall:
    """One tool call the policy made in a turn, and what came of it."""

    name: str
    """Tool name as the policy wrote it."""
    arguments: dict
    """Parsed arguments (the plain format gives ``{"expression": ...}``)."""
    ok: bool = False
    """True when the tool ran and returned a result."""
    error: str = ""
    """Why it failed: 'malformed', 'unknown tool', 'timeout', 'crashed', an exception, ... ('' when ok)."""


@dataclass
class Turn:
    token_ids: list[int]
    """The policy's sampled token ids, exactly as the engine returned them."""
    logprobs: list[float]
    """The engine's logprob of each sampled token (same length as ``token_ids``)."""
    versions: list[int] = field(default_factory=list)
    """The policy version that sampled each token (empty when the backend does not record them)."""
    observation_ids: list[int] = field(default_factory=list)
    """The environment's reply, tokenised once, appended after this turn; empty on the last turn."""
    text: str = ""
    """Decoded text of ``token_ids`` (for parsing and logs)."""
    observation: str = ""
    """Text of ``observation_ids``."""
    finish_reason: str = ""
    """The engine's finish reason ('stop', 'length')."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation_messages: list[dict] = field(default_factory=list)
    """The environment's reply as chat messages (framed by the chat template into ``observation_ids``)."""


@dataclass
class Episode:
    prompt_ids: list[int]
    """The first prompt, tokenised once."""
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    """The episode's reward (0 when the reward function failed)."""
    env_reward: float | None = None
    """A reward the environment gave in its last step, if any; it is used instead of the task's reward."""
    correct: bool = False
    """The task's own check of the final answer (for accuracy)."""
    done_reason: str = ""
    """Why the episode ended: 'done' (the environment said so), 'max_turns' or 'max_total_tokens'."""

    def context(self) -> list[int]:
        """The ids the next turn's prompt is: prompt + every turn's sampled ids + observation ids."""
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.token_ids + turn.observation_ids
        return ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + sum(len(t.token_ids) + len(t.observation_ids) for t in self.turns)

    @property
    def versions(self) -> list[int]:
        """The policy version of every sampled token, turn after turn (an episode spanning syncs has several)."""
        return [v for turn in self.turns for v in turn.versions]

    @property
    def final_text(self) -> str:
        return self.turns[-1].text if self.turns else ""

    def row(self) -> tuple[list[int], list[int], list[float], list[float]]:
        """(prompt ids, completion ids, rollout logprobs, loss mask) for one training row: after the
        prompt, each turn's sampled ids (mask 1, the engine's logprobs) then its observation (mask 0)."""
        ids, logps, mask = [], [], []
        for turn in self.turns:
            if len(turn.logprobs) != len(turn.token_ids):
                raise ValueError(
                    f"a turn has {len(turn.token_ids)} token ids but {len(turn.logprobs)} logprobs; "
                    "record one engine logprob per sampled token"
                )
            ids += turn.token_ids + turn.observation_ids
            logps += list(turn.logprobs) + [0.0] * len(turn.observation_ids)
            mask += [1.0] * len(turn.token_ids) + [0.0] * len(turn.observation_ids)
        return list(self.prompt_ids), ids, logps, mask
