"""Policy-loss dispatcher: per-token loss by name, times rollout-correction weights, aggregated.

The losses live one per file (``ppo``, ``gspo``); this module checks shapes, detaches what
must not carry gradient (``old_logp``, advantages, weights), applies the weights and hands the
per-token loss to ``LossAgg``. KL and entropy terms are added by the caller (``kl``, ``entropy``).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from rlx.trainer.algorithms.aggregation import LossAgg
from rlx.trainer.algorithms.gspo import gspo_loss
from rlx.trainer.algorithms.ppo import ppo_loss

LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, float]]]] = {"ppo": ppo_loss, "gspo": gspo_loss}


def policy_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
    weights: Tensor | None = None,
    agg: LossAgg,
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's contribution to the policy loss, and its metrics (clip_frac, ratio_mean, ...).

    ``advantages`` is [B] (one per sequence) or [B, T] (per token); ``weights`` [B, T] are
    rollout-correction importance weights, None = 1.
    """
    if name not in LOSSES:
        raise ValueError(f"policy loss {name!r} is unknown; set algorithm.policy_loss to one of {', '.join(LOSSES)}")
    _check_shapes(logp, old_logp, advantages, mask, weights)
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (or 0 to turn it off); set algorithm.dual_clip")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    per_token, metrics = LOSSES[name](
        logp, old_logp.detach(), advantages.detach().to(logp.dtype), mask, clip_low, clip_high, dual_clip
    )
    if weights is not None:
        per_token = per_token * weights.detach().to(per_token.dtype)
    return agg(per_token, mask), metrics


def _check_shapes(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor | None) -> None:
    shape = tuple(logp.shape)
    others = {"old_logp": old_logp, "mask": mask} | ({"weights": weights} if weights is not None else {})
    bad = {k: tuple(v.shape) for k, v in others.items() if tuple(v.shape) != shape}
    if logp.dim() != 2 or bad:
        raise ValueError(f"logp {shape} must be [B, T] and match old_logp, mask and weights; got {bad}")
    if tuple(advantages.shape) not in ((shape[0],), shape):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B]={shape[0]} or [B, T]={shape}")
