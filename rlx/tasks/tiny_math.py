"""tiny_math: synthetic arithmetic a tiny character-level model learns on a CPU.

Problems are every ``a<op>b=`` with a, b in [0, task.max_operand] and op in task.operators,
answered by the exact integer (negative for some subtractions). The prompt is exactly
``"12+7="`` and the model is expected to write ``"19"`` then stop, so a completion is correct
when, stripped and cut at its first newline, it equals the answer. ``task.num_eval`` problems
chosen with ``task.seed`` are held out; the rest are the train split. Both are reproducible
from the config alone. Division and multi-step problems are left out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.tasks.base import Problem, RewardFn, task_reward

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def all_problems(max_operand: int, operators: str) -> list[Problem]:
    """Every problem, in a fixed order (operator, then a, then b); ids are positions in it."""
    texts = [
        (f"{a}{op}{b}=", str(OPERATIONS[op](a, b)))
        for op in operators
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    return [Problem(id=i, prompt=prompt, answer=answer) for i, (prompt, answer) in enumerate(texts)]


def split(problems: list[Problem], num_eval: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): ``num_eval`` problems drawn with ``seed``, both kept in id order."""
    if num_eval >= len(problems):
        raise ConfigError(
            f"task.num_eval={num_eval} leaves no training problems out of {len(problems)}; "
            "lower task.num_eval or raise task.max_operand"
        )
    held_out = set(random.Random(seed).sample(range(len(problems)), num_eval))
    train = [p for p in problems if p.id not in held_out]
    return train, [p for p in problems if p.id in held_out]


def normalize(completion: str) -> str:
    return completion.strip().split("\n", 1)[0].strip()


@dataclass
class TinyMath:
    train: list[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    reward_fn: RewardFn | None = None
    name: str = field(default="tiny_math", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> TinyMath:
        train, eval_ = split(all_problems(cfg.max_operand, cfg.operators), cfg.num_eval, cfg.seed)
        return cls(train, eval_, reward_fn)

    def answer_of(self, completion: str) -> str:
        """The completion's answer as maj@k votes it."""
        return normalize(completion)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return normalize(completion) == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        return task_reward(self.reward_fn, lambda: self.is_correct(completion, problem), completion, problem)
