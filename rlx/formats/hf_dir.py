"""A Hugging Face model directory's small files: which ones hold its tokenizer, and reading a JSON file in it
(config.json, a manifest, an adapter config) with a bound on its size, as one object, every failure an error
naming the file and the fix. Exported models, checkpoints, adapters and rollout dumps all use these."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.txt",
)
"""Every file a model directory may keep its tokenizer in: copied beside an exported model, a checkpoint or an
adapter, and hashed into a rollout dump's tokenizer fingerprint."""
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Any one of these means the directory holds a tokenizer (the others only complete one)."""
CONFIG_FILES = ("config.json", "generation_config.json")
"""The model's own config files, copied beside the tokenizer's wherever a model is written."""


def has_tokenizer(model_dir: str | Path) -> bool:
    return any(Path(model_dir, name).is_file() for name in TOKENIZER_MARKERS)


def copy_files(src: Path, dst: Path, names: tuple[str, ...]) -> list[str]:
    """Copy each of ``names`` that ``src`` holds into ``dst``; the names copied."""
    copied = [name for name in names if (src / name).is_file()]
    for name in copied:
        shutil.copy2(src / name, dst / name)
    return copied


def read_json_object(
    path: Path, what: str, fix: str, max_bytes: int = 64 << 20, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` it should be, e.g. "a model config"); ``error`` naming the file and
    ``fix`` where it is larger than ``max_bytes``, not JSON, or not an object. A missing file is the caller's to
    name (``FileNotFoundError`` passes through)."""
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{path} is {size / 2**20:.0f} MiB, not {what}; {fix}")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path} holds a JSON {type(data).__name__}, not {what}; {fix}")
    return data
