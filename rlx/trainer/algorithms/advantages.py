"""Advantage dispatcher: name -> estimator, sequence-level advantages [B] from rewards [B].

Rows are grouped: rows i*n .. i*n+n-1 are the n samples of prompt i. The estimators live one
per file (``grpo``, ``rloo``, ``reinforce_pp``); this module only checks the input and picks.
The result is detached; the trainer broadcasts it over each sequence's tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from rlx.trainer.algorithms.grpo import drgrpo_advantages, grpo_advantages
from rlx.trainer.algorithms.reinforce_pp import reinforce_pp_advantages
from rlx.trainer.algorithms.rloo import rloo_advantages

ESTIMATORS: dict[str, Callable[[Tensor, int, float], Tensor]] = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}
NEEDS_GROUPS = ("grpo", "rloo")


def compute_advantages(name: str, rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Advantages [B] of ``rewards`` [B] by the estimator ``name`` (grpo, drgrpo, rloo, reinforce_pp)."""
    if name not in ESTIMATORS:
        raise ValueError(
            f"advantage estimator {name!r} is unknown; set algorithm.advantage to one of {', '.join(ESTIMATORS)}"
        )
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one value per sequence, shape [B]; got {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of group_size={group_size}; "
            "pass rollout.n and all n samples of every prompt"
        )
    if name in NEEDS_GROUPS and group_size < 2:
        raise ValueError(f"algorithm.advantage={name} needs at least 2 samples per prompt; set rollout.n >= 2")
    rewards = rewards.detach()
    if not rewards.is_floating_point():
        rewards = rewards.float()
    return ESTIMATORS[name](rewards, group_size, eps)
