"""Causal attention over packed sequences, registered with transformers as ``rlx_packed``.

A packed micro-batch is one row holding several sequences back to back; ``cu_seq_lens_q``
(int32 [n + 1], the cumulative lengths) says where each starts, and transformers hands it
through the model's keyword arguments to this function. No token attends across a boundary.

With shared prompts (``rlx.trainer.packing``) a group's prompt is in the row once: the first sample
of the group carries prompt and completion, the others only their completion. ``rlx_kv_index``
then lists, sequence by sequence, the row positions of each one's keys (the shared prompt, then its
own tokens), ``cu_seq_lens_k`` their cumulative counts; keys and values are gathered by it and each
query attends causally with the mask aligned to the last key, flash-attention's convention when a
sequence has fewer queries than keys. The branches:

- CUDA, bf16/fp16, with ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10), sequences
  shorter than ``LONG_SEQUENCE`` on average: one variable-length flash-attention call, no
  padding and no mask.
- otherwise, where ``rlx.trainer.packing`` judged them cheaper (``rlx_blocks``, sequences of a few
  tokens): one batched ``scaled_dot_product_attention`` over blocks, a block being a shared prompt
  and its completions (or one sequence), each with its mask. A CPU kernel pays a fixed share per
  (row, head) pair, so on the quickstart's micro-batch 32 blocks of 39 tokens beat 256 rows of
  about 12 keys: the whole step went from 0.101 s to 0.075 s on one core;
- otherwise, short sequences (CPU, float32): one batched ``scaled_dot_product_attention`` over the
  sequences laid out as padded rows with a causal and key-padding mask (one call, not one per
  sequence: on a CPU a quickstart micro-batch of 256 sequences took 2.5x as long one call each);
- long sequences: ``scaled_dot_product_attention`` once per sequence, causal. On an H100 (torch 2.11)
  sdpa's causal kernel runs one 16k sequence in half the time varlen_attn takes, while for
  eight 1280-token sequences one varlen call takes half the time of eight sdpa calls.
- a layer with a sliding window or attention-logit soft-capping (Gemma 2 and 3, Mistral and Qwen2
  with their windows on), which neither sdpa nor varlen_attn takes: explicit scores once per
  sequence, capped (``softcap * tanh(s / softcap)``) and masked to the window (a query sees the
  ``sliding_window`` keys up to itself), as transformers' eager attention and vLLM compute them.

The function leaves dropout out (the trainer does not fuse the logprob pass when the model has
dropout, and RL fine-tuning of these models runs without it). transformers builds no mask for
a name it has no mask function for, so a packed forward carries no ``[N, N]`` mask.
"""

from __future__ import annotations

import inspect
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

NAME = "rlx_packed"
KV_INDEX = "rlx_kv_index"
"""Model keyword argument with shared prompts: for each sequence in turn, the row positions of its keys."""
BLOCKS = "rlx_blocks"
"""Model keyword argument: the row as blocks for one batched call (``rlx.trainer.packing.Blocks``)."""
BLOCK_PAIR_COST = 675
"""What one (row, head) pair of a batched CPU sdpa call costs, in scores: float32, 2-vCPU EPYC, fitted to
256 rows of 5 x 12 (5.0 ms forward and backward) against 32 rows of 36 x 36 (2.1 ms)."""
LONG_SEQUENCE = 4096
"""Mean sequence length (tokens) from which one sdpa call per sequence beats one varlen call."""


def use_packed_attention(model) -> None:
    """Switch ``model`` (and its sub-models) to packed-sequence attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    model.set_attn_implementation(NAME)


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query/key/value [1, heads, N, head_dim] -> (output [1, N, heads, head_dim], None)."""
    cu_q = kwargs.get("cu_seq_lens_q")
    if cu_q is None or query.shape[0] != 1:
        raise ValueError(
            f"attn_implementation={NAME!r} needs one packed row and cu_seq_lens_q; got a batch of "
            f"{query.shape[0]} rows: build micro-batches with rlx.trainer.packing"
        )
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    blocks = None if window or softcap else kwargs.get(BLOCKS)
    if blocks is not None and not _varlen_ok(query, scaling):
        return _blocked(query, key, value, blocks, scaling, query.shape[1] != key.shape[1]), None
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is None:
        cu_k, max_q, max_k = cu_q, int(kwargs["max_length_q"]), int(kwargs["max_length_q"])
    else:  # shared prompts: each sequence's keys are its prompt's (once in the row) and then its own tokens
        key, value = key[:, :, kv_index], value[:, :, kv_index]
        cu_k, max_q, max_k = kwargs["cu_seq_lens_k"], int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    if window or softcap:
        return _explicit(query, key, value, cu_q, cu_k, scaling, window, softcap), None
    num_sequences = cu_q.numel() - 1
    short = query.shape[2] < LONG_SEQUENCE * num_sequences
    if short and _varlen_ok(query, scaling):
        return _varlen(query, key, value, cu_q, cu_k, max_q, max_k, scaling), None
    groups = query.shape[1] // key.shape[1]
    if short:
        return _padded(query, key, value, cu_q, cu_k, scaling, groups > 1), None
    outputs = []
    for (qs, qe), (ks, ke) in zip(itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True):
        causal = {"is_causal": True} if qe - qs == ke - ks else {"attn_mask": causal_lower_right(qe - qs, ke - ks)}
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, qs:qe], key[:, :, ks:ke], value[:, :, ks:ke], scale=scaling, enable_gqa=groups > 1, **causal
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _explicit(query, key, value, cu_q, cu_k, scaling, window: int | None, softcap: float | None):
    """Per sequence, the scores computed out: soft-capped, causal aligned to the last key, and limited to the last
    ``window`` keys up to each query (``kv > q - window``, transformers' sliding window and vLLM's). Softmax in
    float32, as transformers' eager attention does it."""
    groups = query.shape[1] // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    outputs = []
    for (qs, qe), (ks, ke) in zip(itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True):
        q, k, v = query[0, :, qs:qe], key[0, :, ks:ke], value[0, :, ks:ke]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        scores = (q @ k.transpose(-1, -2)) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(qe - qs, device=query.device) + (ke - ks) - (qe - qs)
        k_pos = torch.arange(ke - ks, device=query.device)
        allowed = k_pos[None, :] <= q_pos[:, None]
        if window:
            allowed &= k_pos[None, :] > q_pos[:, None] - window
        weights = scores.masked_fill(~allowed, float("-inf")).float().softmax(dim=-1).to(v.dtype)
        outputs.append(weights @ v)  # [heads, Lq, d]
    return torch.cat(outputs, dim=1).transpose(0, 1).unsqueeze(0)


def _padded(query, key, value, cu_q, cu_k, scaling, gqa: bool):
    """Short sequences without varlen: one batched sdpa call over the sequences laid out as padded rows
    (``[sequences, heads, longest, head_dim]``, a causal mask aligned to the last key, and a key-padding
    mask), then the real positions gathered back in order. One kernel call instead of one per sequence,
    which dominates on CPUs."""
    q_len, k_len = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    q_offsets = torch.arange(int(q_len.max()), device=query.device)
    k_offsets = torch.arange(int(k_len.max()), device=query.device)
    q_valid = q_offsets[None, :] < q_len[:, None]  # [S, Lq]
    k_valid = k_offsets[None, :] < k_len[:, None]  # [S, Lk]
    q_index = (cu_q[:-1, None] + q_offsets[None, :]).clamp(max=query.shape[2] - 1)
    k_index = (cu_k[:-1, None] + k_offsets[None, :]).clamp(max=key.shape[2] - 1)
    rows_q = query[0][:, q_index].transpose(0, 1)  # [S, heads, Lq, d]
    rows_k, rows_v = (t[0][:, k_index].transpose(0, 1) for t in (key, value))  # [S, kv heads, Lk, d]
    # query i of a sequence sees its keys up to i + (keys - queries): the prompt it shares, then itself
    shift = (k_len - q_len)[:, None, None]
    causal = k_offsets[None, None, :] <= q_offsets[None, :, None] + shift  # [S, Lq, Lk]
    mask = (causal & k_valid[:, None, :]).unsqueeze(1)
    out = F.scaled_dot_product_attention(rows_q, rows_k, rows_v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2)[q_valid].unsqueeze(0)  # [1, N, heads, d]


def _blocked(query, key, value, blocks, scaling, gqa: bool):
    """Short sequences in blocks (a shared prompt and its completions, or one sequence): one batched sdpa
    call over ``[blocks, heads, longest, head_dim]`` with each block's mask, then the real positions back in
    row order. A block's tokens are both its queries and its keys, so no key is gathered twice."""
    rows_q, rows_k, rows_v = (t[0][:, blocks.index].transpose(0, 1) for t in (query, key, value))
    out = F.scaled_dot_product_attention(rows_q, rows_k, rows_v, attn_mask=blocks.mask, scale=scaling, enable_gqa=gqa)
    out = out.transpose(1, 2)[blocks.valid]  # [N, heads, d], block order
    return (out if blocks.inverse is None else out[blocks.inverse]).unsqueeze(0)


def _varlen_ok(query: torch.Tensor, scaling) -> bool:
    if not (query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and _varlen_fn() is not None):
        return False
    default_scale = scaling is None or abs(scaling - query.shape[-1] ** -0.5) < 1e-9
    return default_scale or "scale" in _varlen_fn()[1]


def _varlen(query, key, value, cu_q, cu_k, max_q: int, max_k: int, scaling):
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
    out = fn(q, k, v, cu_q, cu_k, max_q, max_k, **extra)  # causal aligned to the last key, as flash-attention does
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
