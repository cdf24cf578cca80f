"""Write a Hugging Face model directory: sharded safetensors, index, config and tokenizer files.

The weights come from any converter as a list of ``OutTensor``; the non-weight files (config,
generation config, tokenizer, chat template) are copied from a template directory, with the
config's dtype updated when ``--dtype`` changed it. Shards are written in parallel threads.

Left out: where the tensors come from and what they are named (the converters).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rlx.convert.errors import ConvertError
from rlx.convert.safetensors_writer import OutTensor, Shard, plan_shards, write_index, write_shard
from rlx.formats.hf_dir import read_json_object

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".distcp")
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | None) -> torch.dtype | None:
    """'auto' / None keeps each tensor's dtype; otherwise float32 | bfloat16 | float16."""
    if name in (None, "auto"):
        return None
    if name not in DTYPE_NAMES:
        raise ConvertError(f"--dtype {name} is not supported; use one of auto, {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[name]


def target_dtype(source: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """Cast floating-point tensors to ``dtype``; integer and bool tensors keep theirs."""
    return dtype if dtype is not None and source.is_floating_point else source


def read_model_config(template: Path) -> dict:
    """``template/config.json`` as a dict; a missing or unreadable one is a ConvertError naming the file."""
    path = Path(template) / "config.json"
    if not path.is_file():
        raise ConvertError(
            f"{template} has no config.json; pass the Hugging Face directory of this "
            "model (config + tokenizer) so the output can be loaded"
        )
    config = read_json_object(path, "a model config", "restore the model's config.json", error=ConvertError)
    return config


def copy_model_files(template: Path, out_dir: Path, dtype: torch.dtype | None) -> list[str]:
    """Copy config / tokenizer / generation config (every top-level non-weight file)."""
    read_model_config(template)
    copied = []
    for path in sorted(template.iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not path.name.endswith(".index.json"):
            shutil.copy2(path, out_dir / path.name)
            copied.append(path.name)
    if dtype is not None:
        set_config_dtype(out_dir / "config.json", dtype)
    return copied


def set_config_dtype(config_path: Path, dtype: torch.dtype) -> None:
    # transformers 5 reads "dtype", older readers (vLLM's) "torch_dtype": keep both.
    config = read_model_config(config_path.parent)
    name = str(dtype).removeprefix("torch.")
    config["torch_dtype"] = name
    config["dtype"] = name
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def write_weights(
    out_dir: Path,
    tensors: list[OutTensor],
    shard_bytes: int,
    workers: int,
    on_bytes: Callable[[int], None] | None = None,
) -> list[Shard]:
    """Plan shards, write them with ``workers`` threads, then the index."""
    shards = plan_shards(tensors, shard_bytes)
    write_shards(out_dir, shards, workers, on_bytes)
    write_index(out_dir, shards)
    return shards


def write_shards(
    out_dir: Path,
    shards: list[Shard],
    workers: int,
    on_bytes: Callable[[int], None] | None = None,
    metadata: dict | None = None,
) -> None:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(write_shard, out_dir / s.file_name, s, on_bytes, metadata) for s in shards]
        for future in futures:
            future.result()
