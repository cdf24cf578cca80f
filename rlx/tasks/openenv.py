"""``task.name=openenv``: the problems are the seeds an OpenEnv environment is reset with; the environment
scores the episodes (``rlx.agent.openenv`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.tasks.base import Problem

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig
    from rlx.tasks.base import RewardFn


@dataclass
class OpenEnvTask:
    """Problems are the seeds the environment is reset with; the environment scores the episodes."""

    train: list[Problem] = field(repr=False)
    eval: list[Problem] = field(repr=False)
    name: str = field(default="openenv", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> OpenEnvTask:
        """``task.num_eval`` held-out seeds (0, 1, ...), then ``task.num_train`` train seeds; ``reward_fn`` is not
        used (the environment's reward decides)."""
        seeds = range(cfg.num_eval + cfg.num_train)
        problems = [Problem(id=s, prompt="", answer="", source=f"OpenEnv reset seed={s}") for s in seeds]
        return cls(problems[cfg.num_eval :], problems[: cfg.num_eval])

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return False  # no ground truth: the environment's reward is the only judgement

    def reward(self, completion: str, problem: Problem) -> float:
        return 0.0  # used only for an episode whose environment gave no reward
