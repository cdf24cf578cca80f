"""GSPO policy loss: one importance ratio per sequence, the geometric mean of its token ratios.

    s_i    = exp( (1/L_i) sum_t (logp_it - old_logp_it) )
    l_i    = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high))

"Group Sequence Policy Optimization" (Zheng et al., 2025). Written in the paper's GSPO-token
form, s_it = sg[s_i] * exp(logp_it - sg[logp_it]): every token carries the value s_i and the
gradient s_i * grad logp_it, so with ``seq_mean_token_mean`` aggregation the gradient is
exactly the paper's (1/G) sum_i A_i grad s_i. That is the paper's aggregation and the one to
use; the others reweight sequences by length. The paper's clip ranges are ~1e-3, far smaller
than PPO's, because a sequence ratio moves much less than a token ratio. The log-ratio is
capped at 10 before exp, as in verl, so a diverged sequence cannot overflow.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlx.trainer.algorithms.ppo import clipped_surrogate

MAX_LOG_RATIO = 10.0


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token GSPO loss [B, T]; ``advantages`` broadcast to [B, T] already."""
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    seq_log_ratio = ((logp - old_logp) * mask).sum(dim=-1, keepdim=True) / lengths
    log_ratio = logp - logp.detach() + seq_log_ratio.detach()
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))
    return clipped_surrogate(ratio, advantages, mask, clip_low, clip_high, dual_clip)
