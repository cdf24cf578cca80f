"""Save and restore trainer checkpoints (format: ``rlx.formats.checkpoint``).

Full (unsharded) model and optimizer states are gathered with torch's distributed
state-dict API, so the same code serves one rank and FSDP2; rank 0 writes them into a
temporary directory, fsyncs, writes the manifest last and renames. Loading verifies the
manifest first: a corrupt or partial checkpoint is reported and skipped, never loaded.

A LoRA model (``rlx.trainer.lora``) saves only its adapter, in PEFT's format
(``adapter_model.safetensors`` + ``adapter_config.json``), and the optimizer state of the adapter
weights; the base weights stay in ``model.path``. On several ranks the adapter is gathered whole
(``rlx.trainer.lora.adapter_state``) and loaded back into the shards on every rank, and its optimizer
state goes through the same distributed state-dict API as a full model's. ``before_manifest`` (the
checkpoint plugins' save hook) runs on the staged directory once every rlx file is written and
before the manifest and the rename: what it adds is hashed into the manifest, and when it raises
the staged directory is removed, so the newest complete checkpoint stays the previous one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlx.formats.checkpoint import (
    ADAPTER_CONFIG,
    ADAPTER_FILE,
    CorruptCheckpoint,
    fsync_dir,
    list_checkpoints,
    step_dir_name,
    verify_checkpoint,
    write_manifest,
)
from rlx.formats.hf_dir import CONFIG_FILES, TOKENIZER_FILES, copy_files
from rlx.trainer.optim import live_implementation

log = logging.getLogger(__name__)

HF_FILES = CONFIG_FILES + TOKENIZER_FILES
"""What a checkpoint's hf/ directory keeps of the model directory: its configs and its tokenizer."""


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def save_checkpoint(
    root: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    model_path: str,
    trainer_state: dict[str, Any],
    keep: int,
    before_manifest: Callable[[Path], None] | None = None,
) -> Path | None:
    """All ranks call this (gathering is collective); rank 0 writes. Returns the new directory on rank 0."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from rlx.trainer.lora import is_lora

    lora = is_lora(model)
    model_sd = _adapter_or_model_state(model, lora)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_options())
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        model_file = _write_staged(tmp, model, model_sd, optim_sd, scheduler, model_path, trainer_state, lora)
        if before_manifest is not None:
            before_manifest(tmp)
        extra = {"model_dtype": str(next(iter(model_sd.values())).dtype), "lora": lora}
        write_manifest(tmp, step, [model_file], extra)
        fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written step behind
        raise
    if final.exists():  # left by an earlier run and passed over by --resume (it did not verify): never deleted
        aside = root / f"corrupt-{final.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        os.replace(final, aside)
        log.warning("checkpoint %s already existed and was not resumed from; kept it as %s", final, aside.name)
    os.replace(tmp, final)
    fsync_dir(root)
    _prune(root, keep)
    return final


def _adapter_or_model_state(model, lora: bool) -> dict[str, torch.Tensor]:
    """The LoRA adapter under PEFT's names, or the full model state (gathered: a collective)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if lora:
        from rlx.trainer.lora import adapter_state

        return adapter_state(model)
    model_sd = get_model_state_dict(model, options=_options())
    if getattr(model.config, "tie_word_embeddings", False):
        model_sd.pop("lm_head.weight", None)
    return model_sd


def _write_staged(
    tmp: Path, model, model_sd, optim_sd, scheduler, model_path: str, trainer_state: dict, lora: bool
) -> str:
    """Every file of the checkpoint but the manifest; returns the weights file's name."""
    model_file = ADAPTER_FILE if lora else "model.safetensors"
    _save_tensors({k: v.contiguous() for k, v in model_sd.items()}, tmp / model_file)
    if lora:
        from rlx.trainer.lora import adapter_config

        _write_json(tmp / ADAPTER_CONFIG, adapter_config(model, model_path))
    optim_tensors, optim_groups = _flatten_optimizer(optim_sd)
    _save_tensors(optim_tensors, tmp / "optimizer.safetensors")
    state = dict(trainer_state, scheduler=scheduler.state_dict(), optimizer_param_groups=optim_groups)
    _save_tensors({"torch_cpu": torch.get_rng_state()}, tmp / "rng.safetensors")
    _write_json(tmp / "trainer_state.json", state)
    _copy_hf_files(Path(model_path), tmp / "hf")
    return model_file


def newest_complete_checkpoint(root: Path) -> tuple[Path | None, list[str]]:
    """Newest checkpoint under ``root`` that a run can resume from, and why each newer one was skipped."""
    skipped = []
    for candidate in reversed(list_checkpoints(root)):
        problem = _problem(candidate)
        if problem is None:
            return candidate, skipped
        skipped.append(problem)
    return None, skipped


def resume_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """What ``--resume`` continues from: ``newest_complete_checkpoint`` of ``run_dir/checkpoints``.

    ``(None, [])`` when ``run_dir`` holds no earlier run (no metrics, no checkpoints): a first run
    may pass --resume and starts at step 0. An earlier run without a complete checkpoint is refused
    with ``ConfigError``: starting again at step 0 would truncate its metrics and overwrite its
    checkpoints, so the user chooses (a fresh run moves it aside, or another output directory).
    """
    from rlx.config.errors import ConfigError

    ckpt, skipped = newest_complete_checkpoint(run_dir / "checkpoints")
    if ckpt is not None or not ((run_dir / "metrics.jsonl").exists() or skipped):
        return ckpt, skipped
    why = (
        f"none of its {len(skipped)} checkpoints is complete ({'; '.join(skipped)})"
        if skipped
        else "it has no checkpoint (it stopped before its first one)"
    )
    raise ConfigError(
        f"cannot resume the run in {run_dir}: {why}. Nothing was changed. To start again, run "
        "without --resume (the earlier run's outputs are moved to a sibling directory), or set "
        "trainer.output_dir to a new directory"
    )


def check_resumable(ckpt: Path, model_path: str, data_seed: int, num_problems: int, lora: bool = False) -> None:
    """Refuse a checkpoint this config cannot continue: another model, LoRA on one side only, or another
    data order."""
    from rlx.config.errors import ConfigError

    saved_lora = (ckpt / ADAPTER_FILE).is_file()
    if saved_lora != lora:
        held = "a LoRA adapter" if saved_lora else "full model weights"
        fix = "set model.lora as in that run" if saved_lora else "set model.lora.rank=0"
        raise ConfigError(
            f"cannot resume from {ckpt}: it holds {held} and this config has model.lora.rank "
            f"{'> 0' if lora else '= 0'}; {fix}, or run without --resume"
        )
    changed = _config_changes(ckpt / "hf" / "config.json", Path(model_path) / "config.json")
    if changed:
        raise ConfigError(
            f"cannot resume from {ckpt}: model.path={model_path!r} is not the model it was trained "
            f"from ({changed}); set model.path to that model, or run without --resume"
        )
    state = json.loads((ckpt / "trainer_state.json").read_bytes())  # hash-checked: as the trainer wrote it
    state = state if isinstance(state, dict) else {}
    missing = [k for k in ("data", "scheduler", "optimizer_param_groups") if k not in state]
    if missing:
        raise ConfigError(
            f"cannot resume from {ckpt}: its trainer_state.json has no {', '.join(missing)} (not "
            "written by this rlx's trainer); convert it with `rlx convert-ckpt` and start a new run"
        )
    data = state["data"] if isinstance(state["data"], dict) else {}
    if (data.get("seed"), data.get("num_problems")) != (data_seed, num_problems):
        raise ConfigError(
            f"cannot resume from {ckpt}: it was saved with task.seed={data.get('seed')} over "
            f"{data.get('num_problems')} training problems, this config gives task.seed={data_seed} "
            f"over {num_problems}; resume with the task config of that run, or run without --resume"
        )


_IGNORED_CONFIG_KEYS = frozenset({"transformers_version", "_name_or_path", "dtype", "torch_dtype", "use_cache"})


def _config_changes(saved: Path, current: Path) -> str:
    """'' when the two model configs describe the same model (or the checkpoint kept none), else the
    first differences, named."""
    if not saved.is_file():
        return ""
    a, b = (json.loads(p.read_bytes()) if p.is_file() else {} for p in (saved, current))
    a, b = (c if isinstance(c, dict) else {} for c in (a, b))
    keys = sorted(k for k in set(a) | set(b) if k not in _IGNORED_CONFIG_KEYS and a.get(k) != b.get(k))
    return ", ".join(f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now" for k in keys[:3])


# Verdicts per checkpoint directory, kept while its manifest is unchanged: pre-flight chooses the
# checkpoint and the controller loads it in the same process, and the files are hashed once.
_VERDICTS: dict[Path, tuple[tuple[int, int], str | None]] = {}
RESUME_FILES = ("trainer_state.json", "optimizer.safetensors", "rng.safetensors")


def _problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed from (partial, corrupt, a file missing), or None."""
    manifest = ckpt / "manifest.json"
    stamp = (manifest.stat().st_mtime_ns, manifest.stat().st_size) if manifest.is_file() else (0, 0)
    cached = _VERDICTS.get(ckpt.resolve())
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        listed = verify_checkpoint(ckpt)["files"]
        missing = [name for name in RESUME_FILES if name not in listed]
        problem = f"{ckpt}: the manifest does not list {', '.join(missing)}" if missing else None
    except CorruptCheckpoint as exc:
        problem = str(exc)
    _VERDICTS[ckpt.resolve()] = (stamp, problem)
    return problem


def load_checkpoint(ckpt: Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG on every rank; return the trainer state."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    verify_checkpoint(ckpt, check_hashes=False)  # hashes were checked when it was chosen
    state = json.loads((ckpt / "trainer_state.json").read_text())
    if (ckpt / ADAPTER_FILE).is_file():
        from rlx.trainer.lora import load_adapter_state

        load_adapter_state(model, load_file(str(ckpt / ADAPTER_FILE)))
    else:
        model_sd = load_file(str(ckpt / "model.safetensors"))
        if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in model_sd:
            embed = next((k for k in model_sd if k.endswith("embed_tokens.weight")), None)
            if embed is not None:
                model_sd["lm_head.weight"] = model_sd[embed]
        set_model_state_dict(model, model_sd, options=_options())
    groups = live_implementation(state["optimizer_param_groups"], optimizer)
    optim_sd = _unflatten_optimizer(load_file(str(ckpt / "optimizer.safetensors")), groups)
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
    copy_files(src, dst, HF_FILES)


def _prune(root: Path, keep: int) -> None:
    complete = list_checkpoints(root)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
