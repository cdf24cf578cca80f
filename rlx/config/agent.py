"""``agent``: the config section of multi-turn episodes with tools (``rlx.agent``).

Episodes are multi-turn when the task is ``calc`` or ``openenv`` or ``agent.tools`` is non-empty; otherwise
``rlx train`` makes one generate call per sample as before and this section is unused. It imports
nothing heavy (the schema loads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.checks import check_choice, check_range


@dataclass
class OpenEnvConfig:
    """``task.name=openenv``: episodes against an OpenEnv environment server (``rlx.agent.openenv``)."""

    url: str = ""
    """The environment server's address, e.g. http://127.0.0.1:8000 (it serves OpenEnv's /ws sessions)."""
    action_key: str = "message"
    """The action field that receives the policy's turn text; empty = the turn is the action as a JSON object."""
    observation_key: str = ""
    """The observation field shown to the policy as text; empty = every field but done, reward and metadata, as
    JSON."""
    max_sessions: int = 1
    """Episodes open on the server at once (its max_concurrent_envs); others wait for a free session."""
    timeout_s: float = 60.0
    """Longest one reset or step may take before the episode fails, naming the server."""

    def __post_init__(self) -> None:
        check_range(
            "agent.openenv.max_sessions", self.max_sessions, 1, hint="set it to the server's max_concurrent_envs"
        )
        check_range("agent.openenv.timeout_s", self.timeout_s, 0.01)


@dataclass
class AgentConfig:
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call: built-ins (calc, python), 'name=module:function', 'module:function' or an
    installed 'rlx.tools' entry point; empty = the task's own (calc: [calc])."""
    tool_format: str = "auto"
    """How the policy writes a call: plain (<calc>3*4</calc>, for tiny models), hermes (<tool_call>{json}</tool_call>)
    or auto (hermes when turns are framed by the model's chat template, else plain)."""
    max_turns: int = 4
    """Most policy turns per episode (a turn = one generate call, then the environment's reply)."""
    max_total_tokens: int = 256
    """Most tokens per episode (first prompt + every turn + every observation); also bounded by
    rollout.max_model_len."""
    tool_timeout_s: float = 10.0
    """Wall time one tool call may take before its worker is killed and the call counts as a tool_timeout."""
    tool_memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS, MiB) of each tool and reward worker process."""
    tool_workers: int = 4
    """Tool worker processes (calls beyond this wait for an idle worker)."""
    reward_workers: int = 2
    """Reward worker processes running task.reward (or the task's own reward function) concurrently."""
    reward_timeout_s: float = 10.0
    """Wall time one reward call may take; past it the sample's reward is 0 and reward_errors counts it."""
    max_tool_output_chars: int = 1024
    """A tool's result is cut to this many characters before it becomes an observation."""
    max_worker_output_bytes: int = 65536
    """Bytes of what one tool or reward call prints (stdout and stderr) shown on the console and in the run's
    logs; the rest of that call's output is dropped, with a note saying so. 0 = none shown."""
    openenv: OpenEnvConfig = field(default_factory=OpenEnvConfig)
    """task.name=openenv: the OpenEnv environment server and how turns map to its actions and observations."""

    def __post_init__(self) -> None:
        check_choice("agent.tool_format", self.tool_format, ("auto", "plain", "hermes"))
        check_range("agent.max_turns", self.max_turns, 1)
        check_range("agent.max_total_tokens", self.max_total_tokens, 2)
        check_range("agent.tool_timeout_s", self.tool_timeout_s, 0.01)
        check_range("agent.reward_timeout_s", self.reward_timeout_s, 0.01)
        check_range("agent.tool_memory_mb", self.tool_memory_mb, 64, hint="a Python worker needs about 64 MiB")
        check_range("agent.tool_workers", self.tool_workers, 1)
        check_range("agent.reward_workers", self.reward_workers, 1)
        check_range("agent.max_tool_output_chars", self.max_tool_output_chars, 1)
        check_range("agent.max_worker_output_bytes", self.max_worker_output_bytes, 0, hint="0 shows none of it")
