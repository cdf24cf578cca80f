"""running_sum: add a list of numbers step by step, a task whose answer needs a long completion.

The prompt is ``"3+17+5+9="``; the expected completion writes every partial sum, then the total
after ``#``: ``"3+17=20;20+5=25;25+9=34#34"``. A tiny model cannot add eight numbers in its head,
so it must write the work (about 7-10 characters a term: 60-100 tokens at 8-10 terms), and one
slip anywhere makes the total wrong: generation dominates the step, as in real reasoning RL. A
completion is correct when the number after its last ``#`` (cut at the first newline) is the
total. The reward is shaped: the share of the expected steps (each ``a+b=c``, then the total)
that the completion writes correctly, in order, up to its first wrong one, so a policy that
gets further earns more and a group of samples rarely all scores the same. ``Problem.answer`` holds the whole
worked solution (what the warm start imitates); ``total`` reads the graded number back from it.
Problems are drawn with ``task.seed``: ``task.num_train`` for training, ``task.num_eval`` held
out, never overlapping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.tasks.base import Problem, RewardFn, task_reward

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig


def worked(terms: list[int]) -> str:
    """The expected completion for ``terms``: each partial sum, then ``#total``."""
    steps, total = [], terms[0]
    for term in terms[1:]:
        steps.append(f"{total}+{term}={total + term}")
        total += term
    return ";".join(steps) + f"#{total}"


def total(answer: str) -> str:
    return answer.rsplit("#", 1)[-1]


def draw(count: int, num_terms: int, max_operand: int, rng: random.Random, taken: set[str]) -> list[Problem]:
    problems = []
    while len(problems) < count:
        terms = [rng.randint(0, max_operand) for _ in range(num_terms)]
        prompt = "+".join(map(str, terms)) + "="
        if prompt in taken:
            continue
        taken.add(prompt)
        problems.append(Problem(id=len(taken) - 1, prompt=prompt, answer=worked(terms)))
    return problems


@dataclass
class RunningSum:
    train: list[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    reward_fn: RewardFn | None = None
    name: str = field(default="running_sum", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> RunningSum:
        rng, taken = random.Random(cfg.seed), set()
        eval_ = draw(cfg.num_eval, cfg.num_terms, cfg.max_operand, rng, taken)
        train = draw(cfg.num_train, cfg.num_terms, cfg.max_operand, rng, taken)
        return cls(train, eval_, reward_fn)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        if "#" not in completion:
            return False
        return completion.rsplit("#", 1)[-1].strip().split("\n", 1)[0].strip() == total(problem.answer)

    def reward(self, completion: str, problem: Problem) -> float:
        if self.reward_fn is not None:
            return task_reward(self.reward_fn, lambda: False, completion, problem)
        return progress(completion, problem.answer)


def progress(completion: str, answer: str) -> float:
    """Share of ``answer``'s steps (and its total) that ``completion`` writes right before its first slip."""
    expected = answer.rsplit("#", 1)[0].split(";") + ["#" + total(answer)]
    work, _, final = completion.split("\n", 1)[0].partition("#")
    written = work.split(";") + (["#" + final.strip()] if _ else [])
    right = 0
    for want, got in zip(expected, written, strict=False):
        if want != got.strip():
            break
        right += 1
    return right / len(expected)
