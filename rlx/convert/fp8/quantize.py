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
from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_AMAX = 1e-12
STRATEGIES = ("block", "channel", "tensor")
SLAB_BYTES = 3 << 20


def scale_shape(strategy: str, shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, ...]:
    rows, cols = shape
    if strategy == "block":
        return (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if strategy == "channel":
        return (rows, 1)
    return (1,)


@dataclass
class Quantized:
    """FP8 values, their scale, and the dequantization error (absolute, in weight units) they carry."""

    q: torch.Tensor
    scale: torch.Tensor
    max_abs_err: float
    sum_abs_err: float
    sum_abs: float
    amax: float


def _grouped(w: torch.Tensor, strategy: str, block: tuple[int, int]) -> torch.Tensor:
    """View w [rows, cols] as [G0, a, G1, b]: one scale per (G0, G1) group, zero-padded to whole blocks."""
    rows, cols = w.shape
    if strategy == "channel":
        return w.reshape(rows, 1, 1, cols)
    if strategy == "tensor":
        return w.reshape(1, rows, 1, cols)
    bn, bk = block
    if rows % bn or cols % bk:
        w = torch.nn.functional.pad(w, (0, -cols % bk, 0, -rows % bn))
    return w.reshape(w.shape[0] // bn, bn, w.shape[1] // bk, bk)


def _ungrouped(g: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    rows, cols = shape
    flat = g.reshape(g.shape[0] * g.shape[1], g.shape[2] * g.shape[3])
    return flat if flat.shape == (rows, cols) else flat[:rows, :cols].contiguous()


_FP8_VALUES = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(torch.float32)


def fp8_to_float32(q: torch.Tensor) -> torch.Tensor:
    """A 256-entry table lookup: about twice as fast as ``q.float()`` on CPUs."""
    codes = q.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return torch.index_select(_FP8_VALUES, 0, codes).reshape(q.shape)


def fp8_magnitude(q: torch.Tensor) -> torch.Tensor:
    """|q| as float32, decoded with integer ops (torch's own fp8 -> float32 cast is scalar on CPUs).

    The 7 low bits ``eeeemmm`` of an e4m3 code, placed at bit 4 of a bfloat16, give the exponent
    and mantissa of |q| x 2^-120 (subnormal codes become bfloat16 subnormals); times 2^120 is exact.
    """
    bits = (q.view(torch.uint8) & 0x7F).to(torch.int16)
    bits <<= 4
    return bits.view(torch.bfloat16).float().mul_(2.0**120)


def quantize(w: torch.Tensor, strategy: str, block: tuple[int, int], amax: float | None = None) -> Quantized:
    """w: [rows, cols], computed in float32. ``amax``: the whole tensor's max |w| (strategy "tensor", w a row block).

    Block rows wider than ``SLAB_BYTES`` of float32 (a 70B model's 28672 columns) are quantized in
    column slabs of whole blocks, the same bytes, so that no temporary crosses glibc's mmap
    threshold (``rlx.convert.memory``): a mapped temporary costs fresh zeroed pages on every use,
    measured 3x slower. Narrower rows go in one piece (slabs of them measured slower: strided).
    """
    rows, cols = w.shape
    slab = max(1, SLAB_BYTES // (4 * max(1, rows) * block[1])) * block[1]
    if strategy != "block" or cols <= slab:
        return _quantize(w, strategy, block, amax)
    parts = [_quantize(w[:, start : start + slab], strategy, block, None) for start in range(0, cols, slab)]
    return Quantized(
        torch.cat([p.q for p in parts], dim=1),
        torch.cat([p.scale for p in parts], dim=1),
        max(p.max_abs_err for p in parts),
        sum(p.sum_abs_err for p in parts),
        sum(p.sum_abs for p in parts),
        max(p.amax for p in parts),
    )


def _quantize(w: torch.Tensor, strategy: str, block: tuple[int, int], amax: float | None) -> Quantized:
    """Every step is one vectorised pass (reductions run along the contiguous last dim first), and
    two float32 buffers carry them all, so the passes stay in cache. The error is | |q| - |w/s| |,
    which equals |q - w/s| because rounding keeps the sign."""
    g = _grouped(w.float(), strategy, block)
    work = g.abs()
    group_amax = work.amax(dim=3).amax(dim=1)
    chunk_amax = float(group_amax.max()) if group_amax.numel() else 0.0
    sum_abs = float(work.sum())
    if amax is not None:
        group_amax = torch.full_like(group_amax, float(amax))
    scale = group_amax.clamp_(min=MIN_AMAX) / FP8_MAX
    scaled = torch.div(g, scale[:, None, :, None], out=work)  # |w| is no longer needed: w/s takes its place
    del g
    q = scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    err = fp8_magnitude(q).sub_(scaled.abs_()).abs_()  # |q - w/s|; times s it is |deq - w|
    max_err = float((err.amax(dim=3).amax(dim=1) * scale).max()) if err.numel() else 0.0
    sum_err = float((err.sum(dim=3).sum(dim=1) * scale).sum())
    scale = scale.reshape(scale_shape(strategy, tuple(w.shape), block))
    return Quantized(_ungrouped(q, tuple(w.shape)), scale, max_err, sum_err, sum_abs, chunk_amax)


def expand_scale(scale: torch.Tensor, strategy: str, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """The scale broadcast to one value per weight element."""
    rows, cols = shape
    if strategy == "block":
        full = scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
        return full[:rows, :cols]
    return scale.expand(rows, cols) if strategy == "channel" else scale.reshape(1, 1).expand(rows, cols)


def dequantize(q: torch.Tensor, scale: torch.Tensor, strategy: str, block: tuple[int, int]) -> torch.Tensor:
    g = _grouped(fp8_to_float32(q), strategy, block)
    return _ungrouped(g * scale.reshape(g.shape[0], 1, g.shape[2], 1), tuple(q.shape))


def error_bound(w: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    """Largest |deq - w| e4m3 rounding allows per element (see the module docstring)."""
    return w.abs() * 2.0**-4 + scale_full * 2.0**-10
