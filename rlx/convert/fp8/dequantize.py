"""FP8 directory (written by ``rlx fp8-convert``) -> high-precision Hugging Face directory.

Used to compare an FP8 model with its original where no FP8 kernel runs (any transformers on a
CPU): every ``weight`` with a scale is multiplied back, scales are dropped, the rest is copied,
and ``quantization_config`` is removed. Streams one tensor at a time like every converter.
Left out: checkpoints quantized by other tools with other scale names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlx.convert.destination import staged_directory
from rlx.convert.errors import ConvertError
from rlx.convert.fp8.quantize import dequantize
from rlx.convert.hf_job import row_chunks
from rlx.convert.hf_write import copy_model_files, write_weights
from rlx.convert.safetensors_io import SafetensorsDir
from rlx.convert.safetensors_writer import OutTensor, natural_key

_SCALES = {".weight_scale_inv": "block", ".weight_scale": None}


def dequantize_dir(src: Path, dst: Path, dtype: torch.dtype = torch.float32, shard_bytes: int = 5 * 10**9) -> None:
    config = json.loads((src / "config.json").read_text())
    qconfig = config.get("quantization_config")
    if not qconfig:
        raise ConvertError(f"{src}/config.json has no quantization_config; it is not an FP8 checkpoint")
    block = tuple(qconfig.get("weight_block_size") or (1, 1))
    source = SafetensorsDir(src)
    tensors = [t for name in sorted(source.tensors, key=natural_key) if (t := _out(source, name, dtype, block))]
    with staged_directory(dst) as tmp:
        copy_model_files(src, tmp, dtype)
        config = json.loads((tmp / "config.json").read_text())
        config.pop("quantization_config")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_weights(tmp, tensors, shard_bytes, workers=1)


def _out(source: SafetensorsDir, name: str, dtype: torch.dtype, block: tuple[int, int]) -> OutTensor | None:
    if name.endswith(tuple(_SCALES)):
        return None
    info = source.tensors[name]
    if not info.dtype.startswith("F8"):
        to = dtype if info.torch_dtype.is_floating_point else info.torch_dtype
        return OutTensor(name, to, info.shape, row_chunks(source, name, to))
    for suffix, strategy in _SCALES.items():
        scale_name = name[: -len(".weight")] + suffix
        if scale_name in source.tensors:
            scale = source.tensors[scale_name]
            kind = strategy or ("channel" if scale.shape == (info.shape[0], 1) else "tensor")
            return OutTensor(
                name,
                dtype,
                info.shape,
                lambda scale_name=scale_name, kind=kind: [
                    dequantize(source.read(name), source.read(scale_name), kind, block).to(dtype)
                ],
            )
    raise ConvertError(f"{name} is FP8 but {source.path} has no scale for it")
