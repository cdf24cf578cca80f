"""GRPO advantages: each reward normalised within its prompt's group.

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      GRPO, "DeepSeekMath" (Shao et al., 2024)
    A_i =  r_i - mean_g(r)                          Dr.GRPO, "Understanding R1-Zero-Like
                                                    Training: A Critical Perspective" (Liu et al., 2025)

std is the unbiased (Bessel-corrected) standard deviation, as in verl and TRL. A group whose
rewards are all equal gets zero advantages. Token-level (process) rewards are left out.
"""

from __future__ import annotations

from torch import Tensor


def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale_by_std:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def drgrpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    return grpo_advantages(rewards, group_size, eps, scale_by_std=False)
