"""Save and restore trainer checkpoints (format: ``rlx.engine.checkpoint_format``).

Full (unsharded) model and optimizer states are gathered with torch's distributed
state-dict API, so the same code serves one rank and FSDP2; rank 0 writes them into a
temporary directory, fsyncs, writes the manifest last and renames. Loading verifies the
manifest first: a corrupt or partial checkpoint is reported and skipped, never loaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlx.engine.checkpoint_format import (CorruptCheckpoint, fsync_dir, list_checkpoints, step_dir_name,
                                          verify_checkpoint, write_manifest)

log = logging.getLogger("rlx.checkpoint")
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def save_checkpoint(root: Path, step: int, model, optimizer, scheduler, model_path: str,
                    trainer_state: dict[str, Any], keep: int) -> Path | None:
    """All ranks call this (gathering is collective); rank 0 writes. Returns the new directory on rank 0."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model_sd = get_model_state_dict(model, options=_options())
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_options())
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if getattr(model.config, "tie_word_embeddings", False):
        model_sd.pop("lm_head.weight", None)
    _save_tensors({k: v.contiguous() for k, v in model_sd.items()}, tmp / "model.safetensors")
    optim_tensors, optim_groups = _flatten_optimizer(optim_sd)
    _save_tensors(optim_tensors, tmp / "optimizer.safetensors")
    state = dict(trainer_state, scheduler=scheduler.state_dict(), optimizer_param_groups=optim_groups)
    _save_tensors({"torch_cpu": torch.get_rng_state()}, tmp / "rng.safetensors")
    _write_json(tmp / "trainer_state.json", state)
    _copy_hf_files(Path(model_path), tmp / "hf")
    write_manifest(tmp, step, ["model.safetensors"], {"model_dtype": str(next(iter(model_sd.values())).dtype)})
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    _prune(root, keep)
    return final


def latest_valid_checkpoint(root: Path) -> Path | None:
    """Newest complete checkpoint under ``root``; corrupt or partial ones are reported and skipped."""
    for candidate in reversed(list_checkpoints(root)):
        try:
            verify_checkpoint(candidate)
            return candidate
        except CorruptCheckpoint as exc:
            log.warning("skipping checkpoint: %s", exc)
    return None


def load_checkpoint(ckpt: Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG on every rank; return the trainer state."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    verify_checkpoint(ckpt, check_hashes=False)  # hashes were checked when it was chosen
    model_sd = load_file(str(ckpt / "model.safetensors"))
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in model_sd:
        embed = next((k for k in model_sd if k.endswith("embed_tokens.weight")), None)
        if embed is not None:
            model_sd["lm_head.weight"] = model_sd[embed]
    state = json.loads((ckpt / "trainer_state.json").read_text())
    set_model_state_dict(model, model_sd, options=_options())
    optim_sd = _unflatten_optimizer(load_file(str(ckpt / "optimizer.safetensors")), state["optimizer_param_groups"])
    set_optimizer_state_dict(model, optimizer, optim_sd, options=_options())
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(load_file(str(ckpt / "rng.safetensors"))["torch_cpu"])
    return state


def _flatten_optimizer(optim_sd: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {}
    for fqn, entry in optim_sd["state"].items():
        for key, value in entry.items():
            tensors[f"{fqn}::{key}"] = torch.as_tensor(value).contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in optim_sd["param_groups"]]
    return tensors, groups


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict]) -> dict:
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        fqn, name = key.rsplit("::", 1)
        state.setdefault(fqn, {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in groups]
    return {"state": state, "param_groups": groups}


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=_json_default)
        f.flush()
        os.fsync(f.fileno())


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in trainer_state.json")


def _copy_hf_files(src: Path, dst: Path) -> None:
    dst.mkdir()
    for name in HF_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def _prune(root: Path, keep: int) -> None:
    complete = list_checkpoints(root)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
