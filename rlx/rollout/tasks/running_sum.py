"""running_sum: add a list of numbers step by step, a task whose answer needs a long completion.

The prompt is ``"3+17+5+9="``; the expected completion writes every partial sum, then the total
after ``#``: ``"3+17=20;20+5=25;25+9=34#34"``. A tiny model cannot add eight numbers in its head,
so it must write the work (about 10 characters a term: 64-100 tokens at the default 8 terms),
and one slip anywhere makes the total wrong: generation dominates the step, as in real
reasoning RL. A completion is correct when the number after its last ``#`` (cut at the first
newline) is the total; the worked lines are not graded. ``Problem.answer`` holds the whole
worked solution (what the warm start imitates); ``total`` reads the graded number back from it.
Problems are drawn with ``task.seed``: ``task.num_train`` for training, ``task.num_eval`` held
out, never overlapping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlx.rollout.tasks.base import Problem, RewardFn, task_reward


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
    def from_config(cls, cfg, reward_fn: RewardFn | None = None) -> "RunningSum":
        rng, taken = random.Random(cfg.seed), set()
        eval_ = draw(cfg.num_eval, cfg.num_terms, cfg.max_operand, rng, taken)
        train = draw(cfg.num_train, cfg.num_terms, cfg.max_operand, rng, taken)
        return cls(train, eval_, reward_fn)

    def is_correct(self, completion: str, problem: Problem) -> bool:
        if "#" not in completion:
            return False
        return completion.rsplit("#", 1)[-1].strip().split("\n", 1)[0].strip() == total(problem.answer)

    def reward(self, completion: str, problem: Problem) -> float:
        return task_reward(self.reward_fn, lambda: self.is_correct(completion, problem), completion, problem)
