"""Log-probabilities and entropy of completion tokens, without a whole float32 ``[tokens, vocab]``.

The model's base (``model.model``) gives the final hidden states; only the positions that
score a completion token are kept (``[M, hidden]``), and the LM head is applied to chunks of
``chunk_size`` of them inside ``HeadLogprob``, an autograd function that keeps nothing of the
logits: its backward recomputes the chunk's logits once. So float32 ``[chunk, vocab]`` exists
for one chunk at a time, in forward and backward, and the prompt positions never meet the head.

Entropy comes from the logits the chunk already holds (one more pass over them, no matmul)
and is always returned for logging; its gradient is computed only when the loss uses it
(``entropy_coef``). Where the head cannot be split off the model -- FSDP2 (the root module's
hooks gather the head's shard), a head with a bias, logit soft-capping or scaling, or no
``get_output_embeddings`` -- the model's own forward gives the logits of just those positions
(``logits_to_keep``) and the same chunked function works on them. Vocabulary-parallel
(tensor-parallel) logits are left out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def can_split_head(model) -> bool:
    """Whether ``base(...)`` then ``head`` per chunk computes exactly the model's logits."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    transformed = any(getattr(model.config, name, None) not in (None, 1.0) for name in LOGIT_TRANSFORMS)
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and isinstance(base, torch.nn.Module)
        and not transformed
    )


def completion_logprobs(
    model, mb, temperature: float, chunk_size: int, *, split_head: bool, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [b, T], entropy [b, T])`` of the micro-batch's completion tokens; 0 where the mask is 0.

    Entropy is detached unless ``entropy_grad``.
    """
    scored = mb.batch.mask.bool()
    targets = mb.batch.completion_ids[scored]
    features = _features(model, mb, split_head)
    weight = model.get_output_embeddings().weight if split_head else None
    logp, entropy = chunked_logprobs(features, weight, targets, temperature, chunk_size)
    if not entropy_grad:
        entropy = entropy.detach()
    zeros = torch.zeros(scored.shape, dtype=logp.dtype, device=logp.device)
    return zeros.masked_scatter(scored, logp), zeros.masked_scatter(scored, entropy)


def _features(model, mb, split_head: bool) -> torch.Tensor:
    """[M, hidden] hidden states (split head) or [M, vocab] logits scoring the completion tokens, computed in
    ``model.compute_dtype`` (``rlx_compute_dtype``: autocast) where it differs from the weights' dtype."""
    dtype = getattr(model, "rlx_compute_dtype", None)
    if dtype is None:
        return _model_features(model, mb, split_head)
    with torch.autocast(next(model.parameters()).device.type, dtype=dtype):
        return _model_features(model, mb, split_head)


def _model_features(model, mb, split_head: bool) -> torch.Tensor:
    batch, packed = mb.batch, mb.packed
    if packed is not None:
        if split_head:
            hidden = getattr(model, model.base_model_prefix)(**packed.model_kwargs()).last_hidden_state
            return hidden[0, packed.sources]
        return model(**packed.model_kwargs(), logits_to_keep=packed.sources).logits[0]
    num_completion = batch.completion_ids.shape[1]
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "position_ids": batch.position_ids}
    if split_head:
        hidden = getattr(model, model.base_model_prefix)(**inputs).last_hidden_state
        return hidden[:, -num_completion - 1 : -1][batch.mask.bool()]
    return model(**inputs, logits_to_keep=num_completion + 1).logits[:, :-1][batch.mask.bool()]


def chunked_logprobs(
    features: torch.Tensor, weight: torch.Tensor | None, targets: torch.Tensor, temperature: float, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(logp [M], entropy [M])`` in float32, ``chunk_size`` tokens at a time."""
    if features.shape[0] == 0:  # a filler micro-batch: keep the graph so backward still reaches every layer
        empty = features.sum(dim=-1).float() * 0.0
        return empty, empty
    if weight is not None and features.dtype != weight.dtype:  # autocast's hidden states meet the float32 head
        features = features.to(weight.dtype)
    pieces = [
        HeadLogprob.apply(features[s : s + chunk_size], weight, targets[s : s + chunk_size], temperature)
        for s in range(0, features.shape[0], chunk_size)
    ]
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])


def _stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(logp, entropy, logsumexp) per row of ``logits`` / temperature, in float32."""
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = (torch.exp(z - lse.unsqueeze(-1)) * (lse.unsqueeze(-1) - z)).sum(dim=-1)  # terms >= 0: no cancellation
    return logp, entropy, lse


def _grad_logits(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature: float):
    """d(loss)/d(logits) from d/d logp (onehot - p) and d/d entropy (p * (lse - H - z)), in logits' dtype."""
    z = logits.float() / temperature
    probs = torch.exp(z - lse.unsqueeze(-1))
    onehot = torch.arange(z.shape[-1], device=z.device) == targets.unsqueeze(-1)
    grad = (onehot.float() - probs) * grad_logp.unsqueeze(-1)
    if grad_entropy is not None:
        grad = grad + probs * ((lse - entropy).unsqueeze(-1) - z) * grad_entropy.unsqueeze(-1)
    return (grad / temperature).to(logits.dtype)


_COMPILED: dict = {}


def _fused(fn, logits: torch.Tensor):
    """``fn`` compiled on CUDA (its elementwise passes fused over the chunk), eager elsewhere."""
    if not logits.is_cuda:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


class HeadLogprob(torch.autograd.Function):
    """logp and entropy of ``targets`` under softmax(head(features) / temperature), for one chunk.

    Saves only its inputs and two floats per token; backward recomputes the chunk's logits.
    """

    @staticmethod
    def forward(ctx, features, weight, targets, temperature):
        logits = F.linear(features, weight) if weight is not None else features
        logp, entropy, lse = _fused(_stats, logits)(logits, targets, temperature)
        ctx.save_for_backward(features, weight, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        features, weight, targets, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        logits = F.linear(features, weight) if weight is not None else features
        grad = _fused(_grad_logits, logits)(logits, targets, lse, entropy, grad_logp, grad_entropy, ctx.temperature)
        if weight is None:
            return grad, None, None, None
        grad_weight = grad.t() @ features if ctx.needs_input_grad[1] else None
        return grad @ weight, grad_weight, None, None
