"""megatron-core's local core attention through ``torch.nn.functional.scaled_dot_product_attention``.

The local layer spec's ``DotProductAttention`` materialises every layer's ``[b, heads, s, s]`` scores and
probabilities and keeps them for the backward: on the Qwen 0.5B at 16 rows of about 600 tokens the trainer's
process held 135 GiB on an H200. ``SdpaAttention`` computes the same softmax(q k^T * scale) v with PyTorch's
fused kernels (memory-efficient or flash on CUDA, the math kernel on a CPU), which keep O(s) per row.

rlx's forward (``rlx.trainer.megatron.logprobs.final_hidden``) moves each row's padding to its end and passes
the causal mask alone, so the kernel's own causal masking is that mask. Left out, as the rlx backend never builds
them: dropout, a learnable or off-by-one softmax offset, sliding windows, packed sequences, attention bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa_attention_class():
    """``SdpaAttention``, made on first use (megatron-core is an optional extra)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SdpaAttention(DotProductAttention):
        """``DotProductAttention`` with the forward of the module docstring; its constructor and state unchanged."""

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type=None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params=None,
        ) -> torch.Tensor:
            odd = packed_seq_params, attention_bias, self.softmax_offset, self.config.window_size
            if any(x is not None for x in odd) or self.config.attention_dropout:
                raise NotImplementedError("rlx's SdpaAttention takes padded causal rows only (module docstring)")
            length, batch = query.shape[0], query.shape[1]
            # [s, b, heads, dim] -> [b, heads, s, dim]; grouped keys and values repeated to the query heads
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            groups = q.shape[1] // k.shape[1]
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(length, batch, self.hidden_size_per_partition)

    return SdpaAttention
