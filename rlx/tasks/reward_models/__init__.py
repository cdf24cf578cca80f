"""Learned rewards over a whole step's samples, configured by ``task.reward_model``.

- ``config.py``: the ``task.reward_model`` section (no heavy imports; the schema loads it).
- ``judge.py``: a generative judge served by `rlx rollout-serve`; one batched greedy Generate per step.
- ``classifier.py``: a local ``AutoModelForSequenceClassification`` run in the controller process.

The collectors (``rlx.orchestrator.collector``, ``rlx.orchestrator.episodes``) call ``RewardModel.score`` once per
step after every sample is generated (``trainer.mode=fully_async``: once per step over the groups it takes)
and mix the scores into the task rewards with ``mix``. Held-out evaluation keeps the task's own correctness
check. Left out: per-turn scores of an episode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from rlx.config.reward_models import RewardModelConfig

__all__ = [
    "RewardModel",
    "RewardModelConfig",
    "RewardModelError",
    "Scored",
    "check_reward_model",
    "make_reward_model",
    "mix",
]


class RewardModelError(RuntimeError):
    """The reward model could not score a step (its server is down or timed out)."""


@dataclass
class Scored:
    scores: list[float]
    """One score per sample, in the order given."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Step metrics: reward_model_mean, time_reward_model, and the judge's judge_unparsed."""


class RewardModel(Protocol):
    async def score(self, questions: list[str], responses: list[str], answers: list[str]) -> Scored: ...


def make_reward_model(rm: RewardModelConfig, auth_token: str) -> RewardModel | None:
    """The model ``task.reward_model`` names, or None when it is ``none``; a judge's requests carry
    ``auth_token`` (rollout.auth_token)."""
    if rm.kind == "judge":
        from rlx.tasks.reward_models.judge import Judge

        return Judge(rm, auth_token)
    if rm.kind == "classifier":
        from rlx.tasks.reward_models.classifier import Classifier

        return Classifier(rm)
    return None


async def score_step(model: RewardModel, questions: list[str], responses: list[str], answers: list[str]) -> Scored:
    """``model.score`` with its wall time and the mean score added to the metrics."""
    start = time.perf_counter()
    scored = await model.score(questions, responses, answers)
    scored.metrics["reward_model_mean"] = sum(scored.scores) / max(len(scored.scores), 1)
    scored.metrics["time_reward_model"] = time.perf_counter() - start
    return scored


def mix(task_reward: float, model_score: float, weight: float) -> float:
    return weight * model_score + (1.0 - weight) * task_reward


def check_reward_model(rm: RewardModelConfig, auth_token: str) -> None:
    """Pre-flight: the classifier directory loads as a classifier with its own tokenizer; the judge server
    answers a health check (to ``auth_token``, rollout.auth_token)."""
    if rm.kind == "none":
        return
    if rm.kind == "classifier":
        from rlx.tasks.reward_models.classifier import check_classifier

        check_classifier(rm)
    else:
        from rlx.tasks.reward_models.judge import check_judge_up

        check_judge_up(rm, auth_token)
