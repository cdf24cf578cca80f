"""REINFORCE++ advantages: the reward whitened over the whole step batch, no critic, no groups.

    A_i = (r_i - mean_B(r)) / (std_B(r) + eps)

"REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models" (Hu, 2025).
With outcome rewards and gamma = 1 the return of every token is the sequence reward, so the
advantage is per sequence. The paper's token-level KL enters through the reward
(``algorithm.kl_in_reward``, see ``kl.kl_penalized_rewards``) before this is called. The
batch is the whole step batch: the controller computes advantages before sharding. The
``-baseline`` variant (group mean subtracted first) is left out; ``drgrpo`` is the group form.
std is unbiased, as in ``grpo``.
"""

from __future__ import annotations

from torch import Tensor


def reinforce_pp_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    if rewards.numel() < 2:
        return rewards - rewards.mean()
    return (rewards - rewards.mean()) / (rewards.std() + eps)
