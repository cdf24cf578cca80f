"""GAE: per-token advantages and returns from a critic's values and the terminal reward.

With the outcome reward given on the last completion token (r_t = 0 before it) and the value
after the last token taken as 0:

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}          (A_{L} = 0)
    R_t     = A_t + V_t                                 (the critic's target)

"High-Dimensional Continuous Control Using Generalized Advantage Estimation" (Schulman et al.,
2016), as verl's ``compute_gae_advantage_return``. Advantages are then whitened over the real
tokens of the batch (mean 0, std 1), as verl and OpenRLHF do. Inputs are [B, T] with the
completion right-padded (``mask`` 1 on real tokens); padding gets 0 advantage and return.
Token-level (process) rewards are left out: the reward is one number per sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, whiten: bool = True, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """(advantages [B, T], returns [B, T]) from sequence ``rewards`` [B] and per-token ``values`` [B, T]."""
    if values.dim() != 2 or values.shape != mask.shape or rewards.shape != values.shape[:1]:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be [B] and values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} [B, T]"
        )
    with torch.no_grad():
        mask = mask.to(values.dtype)
        values = values.detach() * mask
        lengths = mask.sum(dim=1).long()
        token_rewards = torch.zeros_like(values)
        rows = torch.nonzero(lengths > 0).squeeze(-1)
        token_rewards[rows, lengths[rows] - 1] = rewards[rows].to(values.dtype)
        advantages = torch.zeros_like(values)
        running = torch.zeros_like(values[:, 0])
        for t in reversed(range(values.shape[1])):
            next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            running = (delta + gamma * lam * running) * mask[:, t]
            advantages[:, t] = running
        returns = (advantages + values) * mask
        if whiten and mask.sum() > 1:
            real = advantages[mask.bool()]
            advantages = (advantages - real.mean()) / (real.std() + eps) * mask
    return advantages, returns
