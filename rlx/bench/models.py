"""Models for ``rlx bench-sync``: Qwen2-shaped synthetic weights, or the tensors of an HF directory.

Presets follow the published Qwen2.5 0.5B / 1.5B / 7B configs (names and shapes as in the
Hugging Face state dict). When a model does not fit the memory budget, whole decoder layers are
dropped -- every tensor keeps its real shape, so bucket packing and split tensors look as they
would at full size -- and the note says so. Synthetic bytes come from a random pool tiled from a
per-tensor offset (generating gigabytes of fresh random numbers would take longer than the bench).
This module leaves out the measurements (``bench``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch


class ModelShape(NamedTuple):
    hidden: int
    intermediate: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab: int
    tied: bool


PRESETS = {
    "0.5b": ModelShape(896, 4864, 24, 14, 2, 151936, tied=True),
    "1.5b": ModelShape(1536, 8960, 28, 12, 2, 151936, tied=True),
    "7b": ModelShape(3584, 18944, 28, 28, 4, 152064, tied=False),
}
_POOL_BYTES = (16 << 20) + 4099  # odd length: the tiling never lines up with slots or buckets


class ModelTensors(NamedTuple):
    label: str  # e.g. "7b (4/28 layers)"
    tensors: list[tuple[str, torch.Tensor]]
    note: str  # empty unless the model was cut to fit

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors)


def layer_shapes(s: ModelShape, i: int) -> list[tuple[str, tuple[int, ...]]]:
    kv = s.num_kv_heads * (s.hidden // s.num_heads)
    p = f"model.layers.{i}."
    return [
        (p + "self_attn.q_proj.weight", (s.hidden, s.hidden)),
        (p + "self_attn.q_proj.bias", (s.hidden,)),
        (p + "self_attn.k_proj.weight", (kv, s.hidden)),
        (p + "self_attn.k_proj.bias", (kv,)),
        (p + "self_attn.v_proj.weight", (kv, s.hidden)),
        (p + "self_attn.v_proj.bias", (kv,)),
        (p + "self_attn.o_proj.weight", (s.hidden, s.hidden)),
        (p + "mlp.gate_proj.weight", (s.intermediate, s.hidden)),
        (p + "mlp.up_proj.weight", (s.intermediate, s.hidden)),
        (p + "mlp.down_proj.weight", (s.hidden, s.intermediate)),
        (p + "input_layernorm.weight", (s.hidden,)),
        (p + "post_attention_layernorm.weight", (s.hidden,)),
    ]


def model_shapes(s: ModelShape, num_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    shapes = [("model.embed_tokens.weight", (s.vocab, s.hidden))]
    for i in range(num_layers):
        shapes += layer_shapes(s, i)
    shapes.append(("model.norm.weight", (s.hidden,)))
    if not s.tied:
        shapes.append(("lm_head.weight", (s.vocab, s.hidden)))
    return shapes


def shapes_bytes(shapes: list[tuple[str, tuple[int, ...]]], itemsize: int) -> int:
    return sum(_numel(shape) for _, shape in shapes) * itemsize


def preset_model(name: str, budget_bytes: int, dtype: torch.dtype, device: str, seed: int = 0) -> ModelTensors:
    """The preset's tensors with as many layers as ``budget_bytes`` allows (at least one)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    s = PRESETS[name]
    layers = s.num_layers
    while layers > 1 and shapes_bytes(model_shapes(s, layers), dtype.itemsize) > budget_bytes:
        layers -= 1
    shapes = model_shapes(s, layers)
    need = shapes_bytes(shapes, dtype.itemsize)
    if need > budget_bytes:
        raise ValueError(
            f"preset {name} needs {need / 1e9:.2f} GB even with one layer, over the "
            f"{budget_bytes / 1e9:.2f} GB budget per copy; raise --memory-gb"
        )
    full = shapes_bytes(model_shapes(s, s.num_layers), dtype.itemsize)
    note = (
        ""
        if layers == s.num_layers
        else (
            f"{name}: scaled down to {layers}/{s.num_layers} layers ({need / 1e9:.2f} of {full / 1e9:.2f} GB) "
            f"to fit the memory budget of {budget_bytes / 1e9:.2f} GB per copy"
        )
    )
    label = name if not note else f"{name} ({layers}/{s.num_layers}L)"
    return ModelTensors(label, synthetic_tensors(shapes, dtype, device, seed), note)


def synthetic_tensors(shapes, dtype: torch.dtype, device: str, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 256, (_POOL_BYTES,), dtype=torch.uint8, generator=gen).to(device)
    out = []
    for name, shape in shapes:
        t = torch.empty(shape, dtype=dtype, device=device)
        _tile(t.view(-1).view(torch.uint8), pool, int(torch.randint(0, _POOL_BYTES, (1,), generator=gen)))
        out.append((name, t))
    return out


def hf_model(path: Path, budget_bytes: int, device: str) -> ModelTensors:
    """The tensors of the ``*.safetensors`` files in ``path``, in file and key order, up to the budget."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}; pass a Hugging Face model directory")
    out, used, skipped = [], 0, 0
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors file handle has keys() but cannot be iterated
                nbytes = _numel(f.get_slice(key).get_shape()) * _itemsize(f.get_slice(key).get_dtype())
                if used + nbytes > budget_bytes:
                    skipped += 1
                    continue
                out.append((key, f.get_tensor(key).to(device)))
                used += nbytes
    note = (
        ""
        if not skipped
        else (
            f"{Path(path).name}: {skipped} tensors left out to fit the memory budget of "
            f"{budget_bytes / 1e9:.2f} GB per copy"
        )
    )
    return ModelTensors(Path(path).name + (" (partial)" if skipped else ""), out, note)


def _tile(flat: torch.Tensor, pool: torch.Tensor, start: int) -> None:
    pos, offset, n = 0, start % pool.numel(), flat.numel()
    while pos < n:
        k = min(n - pos, pool.numel() - offset)
        flat[pos : pos + k].copy_(pool[offset : offset + k])
        pos, offset = pos + k, 0


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


_ST_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def _itemsize(st_dtype: str) -> int:
    return _ST_ITEMSIZE.get(st_dtype, 4)
