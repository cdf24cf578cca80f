"""calc: multiply two 2-digit numbers with a calculator tool, over two turns.

The prompt is ``"47*38="``. A tiny model cannot multiply in its head, so the expected episode is:
turn 1, the policy calls the tool, ``<calc>47*38</calc>`` (generation stops at ``</calc>``); the
environment answers ``=1786`` and a newline (``rlx.agent.env.ToolEnv``); turn 2, the policy
copies the result, ``1786``, and stops. The episode is correct when its last turn, stripped and cut
at its first newline, is the product. The reward is 1.0 when correct, else 0.0 (``score``, run in the
reward workers), or the user's ``task.reward``. Operands are drawn from [10, task.max_operand] with
``task.seed``: ``task.num_train`` train problems and ``task.num_eval`` held out, never overlapping.
``transcript`` is the whole correct episode, which the warm start (``calc_tools_warmstart``)
imitates.

On a chat model (``agent.tool_format=hermes`` and a tokenizer with a chat template) the episode's
first prompt is ``messages``: ``task.num_examples`` (default two) worked examples as chat turns (a
Hermes tool call, the tool's reply, the answer) and then the question, ``What is 47*38?``. The examples multiply by a
one-digit number, which no drawn problem does. A small instruct model (SmolLM2-135M) calls the tool from them on its own
but not always; the reward teaches it to. Other operators and longer expressions are left out.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.tasks.base import Problem, RewardFn, task_reward
from rlx.tasks.tiny_math import normalize

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

REWARD_REF = "rlx.tasks.calc:score"
TOOLS = ["calc"]
STOP = ["</calc>"]


def score(completion: str, answer: str) -> float:
    """The default reward: 1.0 when the final turn states ``answer``."""
    return 1.0 if normalize(completion) == answer else 0.0


def transcript(problem: Problem) -> str:
    """The correct episode after the prompt: the tool call, the tool's observation, the answer."""
    expression = problem.prompt.rstrip("=")
    return f"<calc>{expression}</calc>={problem.answer}\n{problem.answer}"


EXAMPLES = ((4, 213), (96, 7))
"""Worked examples of the chat prompt: a one-digit operand, so never one of the drawn problems."""


def messages(problem: Problem, num_examples: int = len(EXAMPLES)) -> list[dict]:
    """The chat prompt: the first ``num_examples`` worked examples as turns with a Hermes tool call, then the
    question."""
    turns = []
    for a, b in EXAMPLES[:num_examples]:
        call = {"name": "calc", "arguments": {"expression": f"{a}*{b}"}}
        turns += [
            {"role": "user", "content": f"What is {a}*{b}?"},
            {"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": str(a * b)},
        ]
    return turns + [{"role": "user", "content": f"What is {problem.prompt.rstrip('=')}?"}]


def draw(count: int, max_operand: int, rng: random.Random, taken: set[str]) -> list[Problem]:
    problems = []
    space = (max_operand - 9) ** 2
    while len(problems) < count and len(taken) < space:
        a, b = rng.randint(10, max_operand), rng.randint(10, max_operand)
        prompt = f"{a}*{b}="
        if prompt in taken:
            continue
        taken.add(prompt)
        problems.append(Problem(id=len(taken) - 1, prompt=prompt, answer=str(a * b)))
    return problems


@dataclass
class Calc:
    train: list[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    reward_fn: RewardFn | None = None
    num_examples: int = len(EXAMPLES)
    """Worked examples in the chat prompt (``messages``)."""
    name: str = field(default="calc", init=False)
    tools: list[str] = field(default_factory=lambda: list(TOOLS), init=False)
    """Tools the episodes need when agent.tools is empty."""
    reward_ref: str = field(default=REWARD_REF, init=False)
    """The reward as 'module:function', run in the reward workers when task.reward is unset."""
    stop: list[str] = field(default_factory=lambda: list(STOP), init=False)
    """Stop strings of every turn (a tool call ends the turn)."""

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> Calc:
        from rlx.config.errors import ConfigError

        if cfg.max_operand < 11 or cfg.max_operand > 99:
            raise ConfigError(
                f"task.max_operand={cfg.max_operand}: the calc task multiplies 2-digit numbers; "
                "set task.max_operand in [11, 99]"
            )
        rng, taken = random.Random(cfg.seed), set()
        eval_ = draw(cfg.num_eval, cfg.max_operand, rng, taken)
        train = draw(cfg.num_train, cfg.max_operand, rng, taken)
        if not train:
            raise ConfigError(
                f"task.num_eval={cfg.num_eval} leaves no calc problems to train on with "
                f"task.max_operand={cfg.max_operand}; lower task.num_eval"
            )
        return cls(train, eval_, reward_fn, cfg.num_examples)

    def transcript(self, problem: Problem) -> str:
        return transcript(problem)

    def messages(self, problem: Problem) -> list[dict]:
        return messages(problem, self.num_examples)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return normalize(completion) == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        return task_reward(self.reward_fn, lambda: self.is_correct(completion, problem), completion, problem)
