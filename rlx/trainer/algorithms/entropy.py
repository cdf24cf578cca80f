"""Token entropy and the entropy bonus.

    H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_tv        (entropy of the next-token distribution)
    loss += -entropy_coef * agg(H, mask)

The bonus is the aggregated entropy with the same ``LossAgg`` as the policy loss, so it is
split-invariant too; the trainer subtracts it (maximising entropy). Chunking over the
sequence to bound memory is the logprob code's job; this computes one chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlx.trainer.algorithms.aggregation import LossAgg


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy [...] of the softmax over the last dimension of ``logits`` [..., V]."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_bonus(entropy: Tensor, mask: Tensor, agg: LossAgg) -> Tensor:
    """This micro-batch's contribution to the mean entropy (subtract ``entropy_coef`` times it)."""
    return agg(entropy, mask)
