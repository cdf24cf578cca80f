"""FP8 (float8_e4m3fn) weight quantization: per block, per output channel, or per tensor.

Scales follow the checkpoint conventions vLLM loads: the stored scale multiplies the FP8 value
back (``w ≈ q * scale``). For blocks it is called ``weight_scale_inv`` (DeepSeek-V3 / Qwen3-FP8),
for channel and tensor ``weight_scale`` (compressed-tensors).

A block (or row, or tensor) whose values are all zero gets the scale ``MIN_AMAX / 448`` instead of
0, so quantizing it divides by a finite number and gives zeros, not NaN.

Error bound (what tests check): e4m3 keeps 3 mantissa bits, so rounding a value x that was scaled
by 1/s changes it by at most 2^-4 |x| while x is a normal number (|x| >= 2^-6) and by at most
2^-10 below that. Back in weight units: |deq - w| <= 2^-4 |w| + 2^-10 s for every element.

Left out: activation scales (all strategies here quantize activations dynamically at run time).
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_AMAX = 1e-12
STRATEGIES = ("block", "channel", "tensor")


def scale_shape(strategy: str, shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, ...]:
    rows, cols = shape
    if strategy == "block":
        return (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if strategy == "channel":
        return (rows, 1)
    return (1,)


def _to_fp8(w: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    return (w / scale_full).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [rows, cols] float32 -> (fp8 [rows, cols], float32 scale_inv [ceil(rows/bn), ceil(cols/bk)])."""
    bn, bk = block
    rows, cols = w.shape
    padded = torch.nn.functional.pad(w, (0, -cols % bk, 0, -rows % bn))
    blocks = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_(min=MIN_AMAX)
    scale = amax / FP8_MAX
    q = _to_fp8(blocks, scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols].contiguous()
    return q, scale


def quantize_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [rows, cols] -> (fp8, float32 scale [rows, 1])."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp_(min=MIN_AMAX) / FP8_MAX
    return _to_fp8(w, scale), scale


def quantize_tensor(w: torch.Tensor, amax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [rows, cols] (a row block of the tensor) with the whole tensor's ``amax`` -> (fp8, scale [1])."""
    scale = torch.tensor([max(amax, MIN_AMAX) / FP8_MAX], dtype=torch.float32)
    return _to_fp8(w, scale), scale


def expand_scale(scale: torch.Tensor, strategy: str, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """The scale broadcast to one value per weight element."""
    rows, cols = shape
    if strategy == "block":
        full = scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
        return full[:rows, :cols]
    return scale.expand(rows, cols) if strategy == "channel" else scale.reshape(1, 1).expand(rows, cols)


def dequantize(q: torch.Tensor, scale: torch.Tensor, strategy: str, block: tuple[int, int]) -> torch.Tensor:
    return q.to(torch.float32) * expand_scale(scale, strategy, tuple(q.shape), block)


def error_bound(w: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    """Largest |deq - w| e4m3 rounding allows per element (see the module docstring)."""
    return w.abs() * 2.0**-4 + scale_full * 2.0**-10
