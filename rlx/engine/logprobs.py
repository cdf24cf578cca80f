"""Log-probabilities and entropy of completion tokens, bounded in memory.

The batch layout puts every completion at the same column (prompts left-padded), so the
logits that score completion token j sit at one column for all rows and the model is asked
for only those ``T + 1`` positions (``logits_to_keep``). The float32 log-softmax and entropy
are then computed over chunks of ``chunk_size`` tokens, each under activation checkpointing
when gradients are needed, so the float32 ``[tokens, vocab]`` intermediates of only one chunk
are alive at a time. It leaves out vocabulary-parallel (tensor-parallel) logits.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def completion_logprobs(model, batch, temperature: float, chunk_size: int,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(logp [B, T], entropy [B, T] or None)`` for ``batch.completion_ids``."""
    num_completion = batch.completion_ids.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, logits_to_keep=num_completion + 1)
    logits = out.logits[:, :-1, :]
    rows = logits.shape[0]
    tokens_per_chunk = max(1, chunk_size // max(1, rows))
    logps, entropies = [], []
    for start in range(0, num_completion, tokens_per_chunk):
        chunk = logits[:, start:start + tokens_per_chunk]
        targets = batch.completion_ids[:, start:start + tokens_per_chunk]
        if torch.is_grad_enabled():
            logp, ent = checkpoint(_chunk_stats, chunk, targets, temperature, with_entropy, use_reentrant=False)
        else:
            logp, ent = _chunk_stats(chunk, targets, temperature, with_entropy)
        logps.append(logp)
        entropies.append(ent)
    entropy = torch.cat(entropies, dim=1) if with_entropy else None
    return torch.cat(logps, dim=1), entropy


def _chunk_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    logprobs = (logits.float() / temperature).log_softmax(dim=-1)
    token_logp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return token_logp, torch.zeros_like(token_logp)
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return token_logp, entropy
