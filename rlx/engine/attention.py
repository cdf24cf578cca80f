"""Causal attention over packed sequences, registered with transformers as ``rlx_packed``.

A packed micro-batch is one row holding several sequences back to back; ``cu_seq_lens_q``
(int32 [n + 1], the cumulative lengths) says where each starts, and transformers hands it
through the model's keyword arguments to this function. No token attends across a boundary:

- CUDA, bf16/fp16, with ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10), sequences
  shorter than ``LONG_SEQUENCE`` on average: one variable-length flash-attention call, no
  padding and no mask.
- otherwise, short sequences (CPU, float32): one batched ``scaled_dot_product_attention`` over the
  sequences laid out as padded rows with a causal and key-padding mask (one call, not one per
  sequence: on a CPU a quickstart micro-batch of 256 sequences took 2.5x as long one call each);
- long sequences: ``scaled_dot_product_attention`` once per sequence with ``is_causal=True``. On an H100 (torch 2.11)
  sdpa's causal kernel runs one 16k sequence in half the time varlen_attn takes, while for
  eight 1280-token sequences one varlen call takes half the time of eight sdpa calls.

The function leaves dropout out (the trainer does not fuse the logprob pass when the model has
dropout, and RL fine-tuning of these models runs without it). transformers builds no mask for
a name it has no mask function for, so a packed forward carries no ``[N, N]`` mask.
"""

from __future__ import annotations

import inspect
import itertools

import torch
import torch.nn.functional as F

NAME = "rlx_packed"
LONG_SEQUENCE = 4096
"""Mean sequence length (tokens) from which one sdpa call per sequence beats one varlen call."""


def use_packed_attention(model) -> None:
    """Switch ``model`` (and its sub-models) to packed-sequence attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    model.set_attn_implementation(NAME)


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query/key/value [1, heads, N, head_dim] -> (output [1, N, heads, head_dim], None)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None or query.shape[0] != 1:
        raise ValueError(f"attn_implementation={NAME!r} needs one packed row and cu_seq_lens_q; got a batch of "
                         f"{query.shape[0]} rows: build micro-batches with rlx.engine.packing")
    num_sequences = cu_seqlens.numel() - 1
    if _varlen_ok(query, scaling) and query.shape[2] < LONG_SEQUENCE * num_sequences:
        return _varlen(query, key, value, cu_seqlens, int(kwargs["max_length_q"]), scaling), None
    groups = query.shape[1] // key.shape[1]
    if query.shape[2] < LONG_SEQUENCE * num_sequences:
        return _padded(query, key, value, cu_seqlens, scaling, groups > 1), None
    bounds = cu_seqlens.tolist()
    outputs = [F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True,
                                              scale=scaling, enable_gqa=groups > 1)
               for s, e in itertools.pairwise(bounds)]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _padded(query, key, value, cu_seqlens, scaling, gqa: bool):
    """Short sequences without varlen: one batched sdpa call over the sequences laid out as padded rows
    (``[sequences, heads, longest, head_dim]``, causal and key-padding mask), then the real positions
    gathered back in order. One kernel call instead of one per sequence, which dominates on CPUs."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    longest = int(lengths.max())
    offsets = torch.arange(longest, device=query.device)
    valid = offsets[None, :] < lengths[:, None]                                # [S, L]
    index = (cu_seqlens[:-1, None] + offsets[None, :]).clamp(max=query.shape[2] - 1)
    rows = [t[0][:, index].transpose(0, 1) for t in (query, key, value)]        # [S, heads, L, d]
    causal = torch.ones(longest, longest, dtype=torch.bool, device=query.device).tril()
    mask = causal[None, None] & valid[:, None, None, :]
    out = F.scaled_dot_product_attention(*rows, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2)[valid].unsqueeze(0)                              # [1, N, heads, d]


def _varlen_ok(query: torch.Tensor, scaling) -> bool:
    if not (query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and _varlen_fn() is not None):
        return False
    default_scale = scaling is None or abs(scaling - query.shape[-1] ** -0.5) < 1e-9
    return default_scale or "scale" in _varlen_fn()[1]


def _varlen(query, key, value, cu_seqlens, max_len: int, scaling):
    fn, params = _varlen_fn()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, head_dim]
    extra = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if scaling is not None and "scale" in params:
        extra["scale"] = scaling
    out = fn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **extra)
    return out.unsqueeze(0)


_VARLEN: list = []


def _varlen_fn():
    """(varlen_attn, its parameter names), or None where this torch has none."""
    if not _VARLEN:
        try:
            from torch.nn.attention.varlen import varlen_attn
            _VARLEN.append((varlen_attn, set(inspect.signature(varlen_attn).parameters)))
        except ImportError:
            _VARLEN.append(None)
    return _VARLEN[0]
