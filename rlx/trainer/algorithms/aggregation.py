"""Loss aggregation: reduce a per-token loss [B, T] to a scalar, split-invariantly.

A step batch is cut into micro-batches on every rank. Each call returns this micro-batch's
*contribution* ``sum(...) / global_count``, where the global count covers the whole step batch
on all ranks, so the contributions summed over micro-batches and ranks (gradient accumulation
plus an all-reduce SUM) equal the full-batch loss exactly, however the batch was split. A
per-micro-batch mean averaged afterwards would weight short micro-batches wrongly.

Modes (L_i = real tokens of sequence i, G = sequences, N = sum_i L_i, l_it = per-token loss):

- ``token_mean``:               sum_it l_it / N   (DAPO, "DAPO: An Open-Source LLM RL System at Scale")
- ``seq_mean_token_mean``:      (1/G) sum_i (1/L_i) sum_t l_it   (GRPO, "DeepSeekMath")
- ``seq_mean_token_sum_norm``:  (1/G) sum_i (1/max_len) sum_t l_it   (Dr.GRPO, "Understanding
  R1-Zero-Like Training: A Critical Perspective"; max_len is a constant, e.g. rollout.max_tokens)

A sequence with no real tokens contributes 0 (it still counts in ``global_seqs``). Counting
``global_tokens`` / ``global_seqs`` across ranks is the caller's job (one all-reduce per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlx.config.algorithm import LOSS_AGG_CHOICES

AGG_MODES = LOSS_AGG_CHOICES
"""The modes ``LossAgg`` applies: algorithm.loss_agg's choices, defined once in rlx.config.algorithm."""


@dataclass
class LossAgg:
    mode: str
    """token_mean | seq_mean_token_mean | seq_mean_token_sum_norm."""
    global_tokens: float
    """Real tokens in the whole step batch, across all ranks and micro-batches."""
    global_seqs: float
    """Sequences in the whole step batch, across all ranks and micro-batches."""
    max_len: int
    """Constant normaliser of seq_mean_token_sum_norm (rollout.max_tokens)."""

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            raise ValueError(
                f"loss aggregation {self.mode!r} is unknown; set algorithm.loss_agg to one of {', '.join(AGG_MODES)}"
            )
        if self.global_tokens < 0 or self.global_seqs < 0:
            raise ValueError(
                f"global_tokens={self.global_tokens}, global_seqs={self.global_seqs} must be >= 0: "
                "pass the counts of the whole step batch"
            )
        if self.max_len < 1:
            raise ValueError(f"max_len={self.max_len} must be >= 1; pass rollout.max_tokens")

    def __call__(self, per_token: Tensor, mask: Tensor) -> Tensor:
        """This micro-batch's contribution to the global mean of ``per_token`` over ``mask``."""
        if per_token.shape != mask.shape or per_token.dim() != 2:
            raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
        mask = mask.to(per_token.dtype)
        seq_sums = (per_token * mask).sum(dim=-1)
        if self.mode == "token_mean":
            return seq_sums.sum() / max(self.global_tokens, 1.0)
        if self.mode == "seq_mean_token_mean":
            seq_means = seq_sums / mask.sum(dim=-1).clamp(min=1.0)
            return seq_means.sum() / max(self.global_seqs, 1.0)
        return seq_sums.sum() / (self.max_len * max(self.global_seqs, 1.0))


def masked_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of ``values`` over the real tokens of this micro-batch, as a float (for metrics)."""
    mask = mask.to(values.dtype)
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))
