"""The directory layout Megatron-LM uses for checkpoints, and finding the iteration to read.

    <root>/latest_checkpointed_iteration.txt   the newest iteration number (or "release")
    <root>/iter_0000010/                       one torch_dist checkpoint: metadata.json, common.pt,
                                               .metadata, __0_0.distcp, ...
    <root>/hf/                                 (rlx) config + tokenizer of the model, so that the
                                               way back to Hugging Face needs no --hf-config

Left out: the legacy ``mp_rank_XX/model_optim_rng.pt`` format (pickle; refused).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlx.convert.errors import ConvertError

LATEST_FILE = "latest_checkpointed_iteration.txt"
HF_SUBDIR = "hf"


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def is_torch_dist(path: Path) -> bool:
    return (path / LATEST_FILE).is_file() or ((path / "metadata.json").is_file() and (path / ".metadata").exists())


def resolve_iter_dir(src: Path, iteration: int | None) -> Path:
    """The iteration directory to read: ``src`` itself, ``--iteration``, or the latest one."""
    if (src / "metadata.json").is_file():
        iter_dir = src
    elif iteration is not None:
        iter_dir = src / iter_dir_name(iteration)
    elif (src / LATEST_FILE).is_file():
        iter_dir = src / _latest_name(src / LATEST_FILE)
    else:
        raise ConvertError(
            f"{src} is not a torch_dist checkpoint: it has neither metadata.json nor "
            f"{LATEST_FILE}; pass a Megatron checkpoint directory or one of its iter_* folders"
        )
    if not (iter_dir / "metadata.json").is_file():
        raise ConvertError(
            f"{iter_dir} has no metadata.json: the iteration does not exist or its save did "
            "not finish; pick another with --iteration"
        )
    try:
        metadata = json.loads((iter_dir / "metadata.json").read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConvertError(
            f"{iter_dir / 'metadata.json'} is not valid JSON ({exc}); the save did not finish or "
            "the file is corrupt; pick another with --iteration"
        ) from None
    backend = metadata.get("sharded_backend") if isinstance(metadata, dict) else None
    if backend != "torch_dist":
        what = (
            f"a {backend!r} checkpoint" if backend else "not a checkpoint (its metadata.json names no sharded_backend)"
        )
        raise ConvertError(f"{iter_dir} is {what}; only torch_dist is supported")
    return iter_dir


def _latest_name(latest: Path) -> str:
    text = latest.read_text().strip()
    if text == "release":
        return "release"
    if not text.isdigit():
        raise ConvertError(f"{latest} holds {text!r}, not an iteration number; fix it or pass --iteration")
    return iter_dir_name(int(text))


def default_hf_template(src: Path, iter_dir: Path) -> Path | None:
    for root in (src, iter_dir.parent):
        if (root / HF_SUBDIR / "config.json").is_file():
            return root / HF_SUBDIR
    return None
