"""OpenEnv environments through rlx's rollout servers (``task.name=openenv``, config ``agent.openenv``).

OpenEnv (the environment library TRL speaks) serves every environment as an HTTP/WebSocket server with a
Gymnasium-style ``reset`` / ``step`` and typed actions and observations; its environments ship as such
servers (``openenv init`` writes one, the OpenEnv catalogue runs them in containers). rlx talks to one
through OpenEnv's own ``GenericEnvClient``, so the environment's package need not be installed here:

- an episode opens one session on the server (at most ``agent.openenv.max_sessions`` at once, the server's
  ``max_concurrent_envs``) and resets it with ``seed=problem.id``; the reset observation is the first
  prompt (a user message on a chat model, framed by ``rlx.agent.framing``);
- each policy turn becomes one action: the turn's text in the field ``agent.openenv.action_key``, or, with
  an empty key, the turn parsed as a JSON object; an action the environment rejects (not JSON, or a
  validation error from the server) becomes an observation saying so, and the episode goes on;
- each observation is shown as text: the field ``agent.openenv.observation_key``, or every field but
  ``done``, ``reward`` and ``metadata`` as JSON;
- the episode ends when the environment says done (or at agent.max_turns / agent.max_total_tokens), and its
  reward is the sum of the rewards the environment gave at its steps (its return): the environment's own
  reward or rubric decides it. An episode whose environment gave no reward gets 0.

``rlx.tasks.openenv.OpenEnvTask`` is the task: its problems are reset seeds (held-out ids first, then the train ids). It
has no answer to check, so accuracy is not measured (it reads 0); the reward is the signal.

OpenEnv and not ``verifiers``: OpenEnv's client and server install beside vLLM without changing a package
(its web UI's gradio, which pins an older pillow, is left out), while verifiers pins ``mcp`` and ``openai``
below the versions vLLM needs; and an OpenEnv environment is a server any trainer reaches, which is how TRL
and its users run them. The library is imported here only (``INSTALL``: openenv-core without its dependencies,
which the extra carries, gradio left out).
Left out: OpenEnv's MCP tool mode, starting servers from Docker images or Spaces (start the server, give its
URL), and per-step rewards (an episode has one reward).
"""

from __future__ import annotations

import asyncio
import json

from rlx.agent.env import StepResult
from rlx.agent.episode import Turn
from rlx.config.agent import OpenEnvConfig
from rlx.config.errors import ConfigError
from rlx.tasks.base import Problem

INSTALL = "pip install 'rlx[openenv]' && pip install --no-deps openenv-core==0.3.0 (its gradio would downgrade pillow)"
HIDDEN_FIELDS = ("done", "reward", "metadata")


def import_client():
    """OpenEnv's ``GenericEnvClient``; an ``ImportError`` naming the extra when the library is missing."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:
        raise ImportError(
            f"task.name=openenv needs the OpenEnv library, which is not installed ({exc}); install it with {INSTALL}"
        ) from exc
    return GenericEnvClient


class OpenEnvSessions:
    """A run's link to one OpenEnv server: the session limit, and how turns map to actions and back."""

    def __init__(self, cfg: OpenEnvConfig) -> None:
        if not cfg.url:
            raise ConfigError(
                "task.name=openenv needs agent.openenv.url; set it to the environment server's "
                "address, e.g. agent.openenv.url=http://127.0.0.1:8000"
            )
        self.cfg = cfg
        self.client_cls = import_client()
        self.slots = asyncio.Semaphore(cfg.max_sessions)

    def env(self, chat: bool) -> OpenEnvEnv:
        return OpenEnvEnv(self, chat)

    def action(self, text: str) -> dict | str:
        """The action of a turn, or why there is none (a string)."""
        if self.cfg.action_key:
            return {self.cfg.action_key: text.strip()}
        try:
            action = json.loads(text.strip())
        except json.JSONDecodeError as exc:
            return f"the action must be a JSON object ({exc.msg} at character {exc.pos})"
        return action if isinstance(action, dict) else "the action must be a JSON object"

    def observation_text(self, observation: dict) -> str:
        key = self.cfg.observation_key
        if key:
            if key not in observation:
                raise ValueError(
                    f"the OpenEnv observation has no field {key!r} (agent.openenv.observation_key); "
                    f"its fields: {', '.join(sorted(observation))}"
                )
            value = observation[key]
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps({k: v for k, v in observation.items() if k not in HIDDEN_FIELDS})


class OpenEnvEnv:
    """One episode's session on the server (``rlx.agent.env.Environment``, plus ``close``)."""

    def __init__(self, sessions: OpenEnvSessions, chat: bool) -> None:
        self.sessions, self.chat = sessions, chat
        self.client = None
        self.total: float | None = None

    def _reply(self, text: str, done: bool) -> StepResult:
        return StepResult(text, done=done, reward=self.total, messages=[{"role": "user", "content": text}])

    async def _call(self, what: str, call):
        cfg = self.sessions.cfg
        try:
            return await asyncio.wait_for(call, cfg.timeout_s + 1.0)
        except OSError as exc:  # refused, reset, or timed out (TimeoutError is an OSError)
            raise RuntimeError(
                f"the OpenEnv server at {cfg.url} (agent.openenv.url) failed on {what}: "
                f"{exc or type(exc).__name__}; start the environment server there, or raise "
                "agent.openenv.timeout_s for a slow one"
            ) from exc

    async def reset(self, problem: Problem) -> str | list[dict]:
        await self.sessions.slots.acquire()
        cfg = self.sessions.cfg
        self.client = self.sessions.client_cls(
            base_url=cfg.url, connect_timeout_s=cfg.timeout_s, message_timeout_s=cfg.timeout_s
        )
        result = await self._call("reset", self.client.reset(seed=problem.id))
        text = self.sessions.observation_text(result.observation)
        return [{"role": "user", "content": text}] if self.chat else text

    async def step(self, turn: Turn) -> StepResult:
        action = self.sessions.action(turn.text)
        if isinstance(action, str):
            return self._reply(f"error: {action}", done=False)
        try:
            result = await self._call("step", self.client.step(action))
        except RuntimeError as exc:
            if "VALIDATION" not in str(exc):
                raise
            return self._reply(f"error: the environment rejected the action {json.dumps(action)}: {exc}", False)
        if result.reward is not None:
            self.total = (self.total or 0.0) + float(result.reward)
        return self._reply(self.sessions.observation_text(result.observation), bool(result.done))

    async def close(self) -> None:
        """End the session on the server and free its slot (after every episode, however it ended)."""
        if self.client is None:
            return
        client, self.client = self.client, None
        try:
            await client.disconnect()
        finally:
            self.sessions.slots.release()
