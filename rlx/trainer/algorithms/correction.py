"""Rollout correction: importance weights between the trainer's and the rollout engine's policy.

The rollout engine samples with its own kernels (and, off-policy, older weights), so its
logprobs differ from the trainer's ``old_logp`` for the same tokens. With
log w = old_logp - rollout_logp:

    token level:     w_t = exp(log w_t)
    sequence level:  w_t = exp(sum_t' mask_t' log w_t')     (one weight per sequence, broadcast)
    TIS:             w <- min(w, tis_cap)                    "Your Efficient RL Framework Secretly
                                                            Brings You Off-Policy RL Training"
                                                            (Yao et al., 2025)
    IcePop:          w <- w * 1[icepop_low <= w <= icepop_high]    (IcePop, Ling Team, "Every
                                                            Step Evolves: Scaling RL for
                                                            Trillion-Scale Thinking Model", 2025)

    bypass:          no weights; PPO's ratio is taken against the rollout logprobs instead of
                     old_logp (``ratio_anchor``), so its clip bounds how far an update moves each
                     token past the weights that sampled it (verl's bypass mode; the PPO loss of
                     Tinker). With stale samples this is the trust region the weights lack: TIS
                     or IcePop reweight a stale token but let every step push it further.

The weights are detached and multiply the per-token policy loss. The mismatch metrics are
always computed, whatever the method: ``logprob_diff_mean`` = mean |old - rollout| and
``logprob_k3`` = k3 estimate of KL(rollout || trainer) (the samples come from the rollout
policy) and ``prob_diff_mean`` = mean |p_old - p_rollout| of the sampled tokens (verl's and prime-rl's), all
over real tokens; fractions are over real tokens too. Log-weights are capped at
+-20 before exp so a broken sequence cannot overflow. Masking whole sequences or
geometric-mean sequence weights are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlx.config.algorithm import CORRECTION_CHOICES
from rlx.trainer.algorithms.aggregation import masked_mean
from rlx.trainer.algorithms.kl import kl_estimate

METHODS = CORRECTION_CHOICES
"""The corrections ``rollout_correction`` applies: defined once in the schema (algorithm.rollout_correction)."""
LEVELS = ("token", "sequence")
MAX_LOG_WEIGHT = 20.0


@torch.no_grad()
def rollout_correction(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    method: str,
    level: str,
    tis_cap: float,
    icepop_low: float,
    icepop_high: float,
) -> tuple[Tensor | None, dict[str, float]]:
    """Importance weights [B, T] (None for method 'none') and the mismatch/correction metrics."""
    _check(old_logp, rollout_logp, mask, method, level, tis_cap, icepop_low, icepop_high)
    mask = mask.to(old_logp.dtype)
    log_w = (old_logp - rollout_logp) * mask
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
    raw = torch.exp(log_w.clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT))
    metrics = {
        "logprob_diff_mean": masked_mean((old_logp - rollout_logp).abs(), mask),
        "logprob_k3": masked_mean(kl_estimate(rollout_logp, old_logp, "k3"), mask),
        "prob_diff_mean": masked_mean((old_logp.exp() - rollout_logp.exp()).abs(), mask),
        "is_weight_mean": masked_mean(raw, mask),
    }
    if method in ("none", "bypass"):
        return None, metrics
    if method == "tis":
        metrics["tis_clip_frac"] = masked_mean((raw > tis_cap).float(), mask)
        return raw.clamp(max=tis_cap), metrics
    keep = (raw >= icepop_low) & (raw <= icepop_high)
    metrics["icepop_mask_frac"] = masked_mean((~keep).float(), mask)
    return raw * keep.to(raw.dtype), metrics


def ratio_anchor(method: str, old_logp: Tensor, rollout_logp: Tensor) -> Tensor:
    """The logprobs PPO's ratio is taken against: the rollout's own under ``bypass``, else ``old_logp``."""
    return rollout_logp if method == "bypass" else old_logp


def _check(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    method: str,
    level: str,
    tis_cap: float,
    icepop_low: float,
    icepop_high: float,
) -> None:
    if method not in METHODS:
        raise ValueError(
            f"rollout correction {method!r} is unknown; set algorithm.rollout_correction to one of {', '.join(METHODS)}"
        )
    if level not in LEVELS:
        raise ValueError(f"correction level {level!r} is unknown; set algorithm.correction_level to token or sequence")
    if not (old_logp.shape == rollout_logp.shape == mask.shape) or old_logp.dim() != 2:
        raise ValueError(
            f"old_logp {tuple(old_logp.shape)}, rollout_logp {tuple(rollout_logp.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]: the rollout engine returns one logprob per token"
        )
    if method == "tis" and tis_cap <= 0:
        raise ValueError(f"tis_cap={tis_cap} must be > 0; set algorithm.tis_cap (e.g. 2.0)")
    if method == "icepop" and not 0 <= icepop_low < icepop_high:
        raise ValueError(
            f"icepop_low={icepop_low}, icepop_high={icepop_high}: need 0 <= low < high; "
            "set algorithm.icepop_low / algorithm.icepop_high"
        )
