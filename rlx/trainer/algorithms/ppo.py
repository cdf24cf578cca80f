"""PPO-clip policy loss per token, with clip-higher and dual clip.

    r_t  = exp(logp_t - old_logp_t)
    l_t  = max(-A r_t, -A clip(r_t, 1 - clip_low, 1 + clip_high))
    l_t  = min(l_t, -A c)   where A < 0, when dual clip c > 1 is on

PPO: "Proximal Policy Optimization Algorithms" (Schulman et al., 2017). Separate low/high
clip ("clip-higher"): "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (Yu et
al., 2025). Dual clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement
Learning" (Ye et al., 2020) -- it bounds the loss of a negative-advantage token whose ratio
has run far above 1. The log-ratio is clamped to +-20 before exp (as in verl) so a diverged
token cannot overflow. Metrics are means over this micro-batch's real tokens. Aggregation over
tokens is ``LossAgg``'s job; value losses are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlx.trainer.algorithms.aggregation import masked_mean

MAX_LOG_RATIO = 20.0


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float, dual_clip: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """Per-token clipped loss of ``ratio`` [B, T] and its clip metrics over the real tokens."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        is_clipped = (clipped > unclipped).float()
        metrics = {
            "clip_frac": masked_mean(is_clipped, mask),
            "clip_frac_low": masked_mean(is_clipped * (ratio < 1.0).float(), mask),
            "clip_frac_high": masked_mean(is_clipped * (ratio > 1.0).float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": float(ratio.masked_fill(mask == 0, float("-inf")).max()) if mask.any() else 1.0,
        }
    metrics["dual_clip_frac"] = 0.0
    if dual_clip:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (bound < loss)
        loss = torch.where(dual, bound, loss)
        metrics["dual_clip_frac"] = masked_mean(dual.float(), mask)
    return loss, metrics


def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token PPO-clip loss [B, T]; ``advantages`` broadcast to [B, T] already."""
    ratio = torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return clipped_surrogate(ratio, advantages, mask, clip_low, clip_high, dual_clip)
