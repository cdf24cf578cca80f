"""Completion logprobs and entropy from megatron-core's GPTModel, the vocabulary split over tensor-parallel ranks.

Each row of the padded micro-batch (``rlx.trainer.batch``: prompts left-padded) is first turned left-aligned,
its real tokens from column 0, so megatron's rotary positions (0..s-1 per row) are the position ids the engine
saw and a causal mask hides every pad from every real token. The model runs to its final norm
(``final_hidden``); only the positions that score a completion token meet the output layer, ``chunk_size`` at a
time, and each rank holds its own ``[chunk, vocab / TP]`` logits. ``VocabParallelLogprob`` reduces the
softmax's max and sums over the tensor-parallel group (what megatron's ``vocab_parallel_cross_entropy`` does for
the loss, plus the entropy and a temperature), so no rank ever holds a full row of logits; the vocabulary's
padding (to a multiple of TP) is masked out. Entropy is detached unless the loss asks for its gradient.

Left out: packed sequences (TE's THD layout) and context parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def left_aligned(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [b, W], rows [M], columns [M])``: the rows with their left padding moved to the end, cut to
    the longest row's real tokens (``W``; a step's batch is as wide as its longest sample, a micro-batch's rows
    often narrower), and where the hidden state that scores each completion token (``batch.mask`` order) sits in
    them."""
    ids, attention = batch.input_ids, batch.attention_mask
    length, num_completion = ids.shape[1], batch.completion_ids.shape[1]
    prompt_width = length - num_completion
    left_pad = prompt_width - attention[:, :prompt_width].sum(dim=1)
    columns = (torch.arange(length, device=ids.device)[None] + left_pad[:, None]) % length
    width = max(int(attention.sum(dim=1).max()), 1)
    aligned = ids.gather(1, columns)[:, :width]
    rows, tokens = batch.mask.bool().nonzero(as_tuple=True)
    return aligned, rows, prompt_width - 1 + tokens - left_pad[rows]


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``[s, b, hidden]`` after the final norm: GPTModel's forward with its output layer left out (its
    ``post_process`` flag read as off for the call; the decoder keeps its final norm)."""
    length = input_ids.shape[1]
    positions = torch.arange(length, device=input_ids.device)[None].expand_as(input_ids)
    causal = torch.triu(torch.ones(1, 1, length, length, dtype=torch.bool, device=input_ids.device), diagonal=1)
    post_process, model.post_process = model.post_process, False
    try:
        return model(input_ids, positions, attention_mask=causal)
    finally:
        model.post_process = post_process


def output_weight(model) -> torch.Tensor:
    return model.embedding.word_embeddings.weight if model.share_embeddings_and_output_weights else None


def completion_logprobs(
    model, mb, temperature: float, chunk_size: int, vocab_size: int, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [b, T], entropy [b, T])`` of the micro-batch's completion tokens; 0 where the mask is 0."""
    from megatron.core import parallel_state as ps

    batch = mb.batch
    scored = batch.mask.bool()
    aligned, rows, columns = left_aligned(batch)
    hidden = final_hidden(model, aligned)[columns, rows]  # [M, hidden]
    targets = batch.completion_ids[scored]
    group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
    weight = output_weight(model)
    pieces = []
    for start in range(0, max(hidden.shape[0], 1), chunk_size):
        logits, _ = model.output_layer(hidden[start : start + chunk_size], weight=weight)
        vocab_start = ps.get_tensor_model_parallel_rank() * logits.shape[-1]
        pieces.append(
            VocabParallelLogprob.apply(
                logits, targets[start : start + chunk_size], temperature, vocab_start, vocab_size, group
            )
        )
    logp, entropy = torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
    if not entropy_grad:
        entropy = entropy.detach()
    zeros = torch.zeros(scored.shape, dtype=logp.dtype, device=logp.device)
    return zeros.masked_scatter(scored, logp), zeros.masked_scatter(scored, entropy)


def _scaled(logits: torch.Tensor, temperature: float, vocab_start: int, vocab_size: int):
    """(z = logits / temperature in float32 with the padded vocabulary at -inf, the mask of real columns)."""
    columns = vocab_start + torch.arange(logits.shape[-1], device=logits.device)
    valid = columns < vocab_size
    return (logits.float() / temperature).masked_fill(~valid, float("-inf")), valid


class VocabParallelLogprob(torch.autograd.Function):
    """logp and entropy of ``targets`` under softmax(logits / temperature) where each tensor-parallel rank holds
    the columns ``[vocab_start, vocab_start + logits.shape[-1])`` of the vocabulary. Two all-reduces per call
    (the max, then the three sums); the backward needs none (each rank's columns get their own gradient)."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, vocab_start, vocab_size, group):
        z, valid = _scaled(logits, temperature, vocab_start, vocab_size)
        top = z.max(dim=-1).values
        if group is not None:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = torch.exp(z - top[:, None])
        local = (targets >= vocab_start) & (targets < vocab_start + logits.shape[-1])
        index = (targets - vocab_start).clamp(0, logits.shape[-1] - 1)
        target_z = torch.where(local, z.gather(-1, index[:, None]).squeeze(-1), 0.0)
        sums = torch.stack([exp.sum(-1), target_z, torch.where(valid, exp * (z - top[:, None]), 0.0).sum(-1)])
        if group is not None:
            dist.all_reduce(sums, group=group)
        lse = top + torch.log(sums[0])
        logp = sums[1] - lse
        entropy = torch.log(sums[0]) - sums[2] / sums[0]  # two terms >= 0 (z - top <= 0): no cancellation
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.meta = (temperature, vocab_start, vocab_size)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return (None,) * 6
        temperature, vocab_start, vocab_size = ctx.meta
        z, valid = _scaled(logits, temperature, vocab_start, vocab_size)
        probs = torch.exp(z - lse[:, None])
        columns = vocab_start + torch.arange(logits.shape[-1], device=logits.device)
        grad = torch.zeros_like(probs)
        if grad_logp is not None:
            grad = grad + ((columns == targets[:, None]).float() - probs) * grad_logp[:, None]
        if grad_entropy is not None:
            spread = torch.where(valid, (lse - entropy)[:, None] - z, 0.0)
            grad = grad + probs * spread * grad_entropy[:, None]
        return (grad / temperature).to(logits.dtype), None, None, None, None, None
