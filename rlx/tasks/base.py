"""What every task shares: the ``Problem`` record, the ``Task`` protocol and ``DataStream``.

A task is a train and an eval list of problems plus a reward. ``DataStream`` hands out the
train problems in a seeded order that is reshuffled every epoch and can be saved and resumed
(its state is JSON). Batching into samples (rollout.n per prompt) and tokenisation are left
to the rollout client.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Protocol

from rlx.config.errors import ConfigError

RewardFn = Callable[..., float]
"""A user reward: (completion, ground-truth answer) -> float, optionally taking a row's ``REWARD_EXTRAS`` by
keyword; or verl's (data_source, solution_str, ground_truth, extra_info=None) -> float."""
REWARD_EXTRAS = ("data_source", "extra_info")
"""A dataset row's columns a user reward gets by keyword when its signature takes them (or ``**kwargs``)."""


@dataclass(frozen=True)
class Problem:
    id: int
    """Position of the problem in its task (unique across train and eval)."""
    prompt: str
    """Text given to the model."""
    answer: str
    """Ground truth the reward compares against."""
    source: str = field(default="", compare=False)
    """Where the prompt was read, for errors: e.g. "task.path='data.jsonl' row 12"; empty for generated tasks."""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The row's ``REWARD_EXTRAS`` columns it has (data_source, extra_info) and its ``task.extra_keys``, for a user
    reward that takes them by keyword."""


class Task(Protocol):
    name: str
    train: list[Problem]
    eval: list[Problem]

    def reward(self, completion: str, problem: Problem) -> float:
        """The user's reward (task.reward) if set, else 1.0 for a correct answer and 0.0 otherwise."""

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The task's own check of the completion against the ground truth (used for accuracy)."""


def task_reward(reward_fn: RewardFn | None, correct: Callable[[], bool], completion: str, problem: Problem) -> float:
    """The shared body of ``Task.reward``: the user's function, or 1.0/0.0 from ``correct()``."""
    if reward_fn is None:
        return 1.0 if correct() else 0.0
    verl_style, takes = _reward_params(reward_fn)
    extras = {k: v for k, v in problem.extra.items() if takes is None or k in takes}
    if verl_style:  # verl's compute_score(data_source, solution_str, ground_truth, extra_info=None), by name
        kwargs = {key: problem.extra.get(key) for key in REWARD_EXTRAS if key in takes}
        value = reward_fn(solution_str=completion, ground_truth=problem.answer, **{**extras, **kwargs})
        value = value["score"] if isinstance(value, dict) and "score" in value else value  # verl allows a dict
    else:
        value = reward_fn(completion, problem.answer, **extras)
    if not isinstance(value, Real) or not math.isfinite(value):
        name = getattr(reward_fn, "__qualname__", repr(reward_fn))
        raise ValueError(
            f"reward function {name} (task.reward) returned {type(value).__name__} {value!r}; "
            "it must return a finite float"
        )
    return float(value)


def _reward_params(reward_fn: RewardFn) -> tuple[bool, frozenset[str] | None]:
    """Whether ``reward_fn`` has verl's signature (a ``solution_str`` parameter), and the names it takes by keyword
    (None: any, it has ``**kwargs``; none when its signature cannot be read)."""
    try:
        params = inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):
        return False, frozenset()
    by_name = [name for name, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if "solution_str" in by_name:
        return True, frozenset(set(by_name) - {"solution_str", "ground_truth"})
    # the first two take (completion, answer) by position, whatever their names
    return False, None if any_keyword else frozenset(by_name[2:])


PROMPTS_PER_CALL = 4096
"""Prompts tokenized per call when their lengths are checked (the ids of one call are held at once)."""


def check_prompt_lengths(
    problems: list[Problem], count_tokens: Callable[[list[str]], list[int]], max_model_len: int
) -> None:
    """Every prompt leaves room in the context for at least one completion token, as the rollout server
    requires; else a ``ConfigError`` naming the first prompt that does not (its file and row when it was read
    from one), how many do not, and the fix. ``count_tokens``: prompt texts -> their lengths in tokens."""
    too_long: list[tuple[Problem, int]] = []
    for start in range(0, len(problems), PROMPTS_PER_CALL):
        chunk = problems[start : start + PROMPTS_PER_CALL]
        lengths = count_tokens([p.prompt for p in chunk])
        too_long += [(p, n) for p, n in zip(chunk, lengths, strict=True) if n >= max_model_len]
    if not too_long:
        return
    problem, length = too_long[0]
    where = problem.source or f"problem {problem.id} of the task"
    longest = max(n for _, n in too_long)
    others = (
        f" ({len(too_long) - 1} more prompts are too long, the longest {longest} tokens)" if len(too_long) > 1 else ""
    )
    raise ConfigError(
        f"{where}: the prompt is {length} tokens, and rollout.max_model_len={max_model_len} (prompt + "
        f"completion) leaves no room for a completion{others}; shorten or drop those prompts, or "
        f"raise rollout.max_model_len above {longest}"
    )


class DataStream:
    """A resumable, seeded, epoch-shuffled order over a list of problems."""

    def __init__(self, problems: Sequence[Problem], seed: int) -> None:
        if not problems:
            raise ValueError("the task has no training problems; check task.path / task.num_eval")
        self.problems = list(problems) if isinstance(problems, list) else problems  # task.streaming: read when drawn
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(f"rlx-data-{self.seed}-{epoch}").shuffle(order)
        return order

    def next_batch(self, k: int) -> list[Problem]:
        """The next ``k`` problems; crosses into a freshly shuffled epoch when this one runs out."""
        if k < 1:
            raise ValueError(f"batch size k={k} must be >= 1")
        batch = []
        while len(batch) < k:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self.problems[self._order[self.index]])
            self.index += 1
        return batch

    def state(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index, "num_problems": len(self.problems)}

    def load_state(self, state: dict) -> None:
        """Continue from ``state``; it must come from a stream over the same problems and seed."""
        saved = (state.get("seed"), state.get("num_problems"))
        if saved != (self.seed, len(self.problems)):
            raise ValueError(
                f"data position was saved with seed={saved[0]} over {saved[1]} problems, but this run "
                f"has seed={self.seed} over {len(self.problems)}; resume with the same task config"
            )
        if not 0 <= state["index"] <= len(self.problems) or state["epoch"] < 0:
            raise ValueError(f"data position {state} is out of range for {len(self.problems)} problems")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._shuffled(self.epoch)
