"""KL to a reference model, per token, by the k1 / k2 / k3 estimators.

With x = logp - ref_logp on tokens sampled from the policy (Schulman, "Approximating KL
Divergence", 2020):

    k1 = x                       unbiased, high variance, can be negative
    k2 = x^2 / 2                 biased, low variance
    k3 = exp(-x) - (-x) - 1      unbiased, low variance, always >= 0 (GRPO's choice, "DeepSeekMath")

As a loss: ``kl_coef * agg(kl_estimate(logp, ref_logp, est), mask)``. In the reward (PPO /
REINFORCE++ style): ``kl_penalized_rewards`` subtracts ``kl_coef * sum_t KL`` from each
sequence's reward, detached. The exponent of k3 is capped at 20 so a diverged token cannot
overflow. Full-vocabulary (exact) KL is left out: it needs the reference logits, not logprobs.
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_EXPONENT = 20.0


def _k3(log_ratio: Tensor) -> Tensor:
    neg = (-log_ratio).clamp(max=MAX_EXPONENT)
    return torch.exp(neg) - neg - 1.0


KL_ESTIMATORS = {"k1": lambda log_ratio: log_ratio, "k2": lambda log_ratio: 0.5 * log_ratio.square(), "k3": _k3}
"""algorithm.kl_estimator -> the estimate of one token's KL from its log-ratio."""


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' logprobs."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"KL estimator {estimator!r} is unknown; set algorithm.kl_estimator to one of {', '.join(KL_ESTIMATORS)}"
        )
    return KL_ESTIMATORS[estimator](logp - ref_logp)


def kl_penalized_rewards(
    rewards: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: str
) -> Tensor:
    """rewards [B] minus kl_coef times each sequence's summed per-token KL; detached."""
    with torch.no_grad():
        kl = kl_estimate(logp, ref_logp, estimator) * mask.to(logp.dtype)
        return rewards - kl_coef * kl.sum(dim=-1).to(rewards.dtype)
