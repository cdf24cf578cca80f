"""RLOO advantages: each sample's baseline is the mean reward of the *other* samples of its prompt.

    A_i = r_i - (1/(n-1)) sum_{j != i} r_j  =  n/(n-1) * (r_i - mean_g(r))

"Buy 4 REINFORCE Samples, Get a Baseline for Free!" (Kool et al., 2019) and "Back to Basics:
Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs" (Ahmadian
et al., 2024). Needs n >= 2 samples per prompt. No std normalisation (that is GRPO's).
"""

from __future__ import annotations

from torch import Tensor


def rloo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    groups = rewards.view(-1, group_size)
    leave_one_out_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - leave_one_out_mean).reshape(-1)
