"""task.name=external: the task of a run whose episodes an outside agent drives through the servers'
OpenAI endpoint, and their rewards with them.

The task holds no data: its one "problem" is a placeholder that keeps the data stream, checkpoints and
resume as they are for other tasks, and the reward is the one each episode's agent sent. The collector
that takes the finished episodes is rank 0's (``rlx.orchestrator.external``). Left out: held-out
evaluation (no eval problems).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlx.tasks.base import Problem

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig
    from rlx.tasks.base import RewardFn


@dataclass
class External:
    train: list[Problem] = field(default_factory=lambda: [Problem(id=0, prompt="", answer="")])
    eval: list[Problem] = field(default_factory=list)
    name: str = field(default="external", init=False)

    @classmethod
    def from_config(cls, cfg: TaskConfig, reward_fn: RewardFn | None = None, tokenizer_path: str = "") -> External:
        """The agent's episodes carry their own rewards; ``cfg`` and ``task.reward`` have nothing to set."""
        return cls()

    def reward(self, completion: str, problem: Problem) -> float:
        raise NotImplementedError("external episodes carry the reward their agent sent with the finish request")

    def is_correct(self, completion: str, problem: Problem) -> bool:
        return False
