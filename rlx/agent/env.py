"""The environment side of an episode: ``Environment`` and the tool-calling ``ToolEnv``.

An environment is two async calls: ``reset(problem)`` gives the first prompt (its text, or chat
messages), and ``step(turn)`` answers one policy turn with a ``StepResult``: the next observation
(its text and, for a chat model, the messages the chat template frames: one ``tool`` message per
call), whether the episode is done, and optionally a reward (``None``: the episode's reward comes
from the task's reward function once it is done). ``rlx.agent.framing`` turns both into ids.

``ToolEnv`` runs the tool calls a turn makes (``rlx.agent.toolcalls``) in the tool workers,
all at once, and returns their results as the observation; a turn without a call ends the episode.
Its first prompt is the task's ``messages(problem)`` where the task has them and the model a chat
template (``chat=True``), else the problem's prompt text. A
malformed call, an unknown tool, a tool that raises, crashes, hangs or passes its memory limit
all become an observation that says so, and are counted in ``ToolStats``; none ends the run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from rlx.agent.episode import ToolCall, Turn
from rlx.agent.toolcalls import parse_tool_calls
from rlx.agent.workers import WorkerPool
from rlx.tasks.base import Problem
from rlx.trace import tracer


@dataclass
class StepResult:
    observation: str
    """The reply as text (what a model without a chat template reads)."""
    done: bool
    reward: float | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    """The reply as chat messages ({"role": "tool" or "user", "content": ...}); empty = ``observation`` as one
    user message."""


class Environment(Protocol):
    async def reset(self, problem: Problem) -> str | list[dict]:
        """The first prompt of an episode on ``problem``: text, or chat messages."""

    async def step(self, turn: Turn) -> StepResult:
        """Answer the policy's ``turn``."""


@dataclass
class ToolStats:
    """Counters over the tool calls of a step's episodes."""

    calls: int = 0
    ok: int = 0
    errors: int = 0
    """Calls that failed other than by timeout: malformed, unknown tool, raised, crashed."""
    timeouts: int = 0


class ToolEnv:
    """One episode's environment; cheap to make (the worker pool is shared)."""

    def __init__(
        self, tools: dict[str, str], pool: WorkerPool | None, fmt: str, stats: ToolStats, task=None, chat: bool = False
    ) -> None:
        self.tools, self.pool, self.fmt, self.stats = tools, pool, fmt, stats
        self.task_messages = getattr(task, "messages", None) if chat else None
        self.problem: Problem | None = None

    async def reset(self, problem: Problem) -> str | list[dict]:
        self.problem = problem
        return self.task_messages(problem) if self.task_messages is not None else problem.prompt

    async def step(self, turn: Turn) -> StepResult:
        calls = parse_tool_calls(turn.text, self.fmt)
        if not calls:
            return StepResult("", done=True)
        replies = await asyncio.gather(*(self._run(call) for call in calls))
        return StepResult(
            "".join(self._observation(reply) for reply in replies),
            done=False,
            tool_calls=calls,
            messages=[{"role": "tool", "content": reply} for reply in replies],
        )

    async def _run(self, call: ToolCall) -> str:
        self.stats.calls += 1
        if not call.error and call.name not in self.tools:
            call.error = f"unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools)) or 'none'}"
        if call.error:
            self.stats.errors += 1
            return f"error: {call.error}"
        with tracer.span("agent.tool", tool=call.name) as span:
            result = await self.pool.call(self.tools[call.name], call.arguments)
            span.set(ok=result.ok, kind=result.kind)
        if result.ok:
            call.ok = True
            self.stats.ok += 1
            return str(result.value)
        call.error = result.error
        if result.kind == "timeout":
            self.stats.timeouts += 1
        else:
            self.stats.errors += 1
        return f"error: {result.error}"

    def _observation(self, reply: str) -> str:
        if self.fmt == "hermes":
            return f"<tool_response>\n{reply}\n</tool_response>\n"
        return f"={reply}\n"
