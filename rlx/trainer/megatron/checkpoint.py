"""Checkpoints of ``trainer.backend=megatron``: the model and AdamW's state in megatron's torch_dist format.

A checkpoint is rlx's step directory (``rlx.formats.checkpoint``: a manifest hashing every file, written last,
the directory renamed into place) with the weights and the optimizer's moments in ``megatron/``, one torch_dist
checkpoint written by every rank at once through megatron-core's ``dist_checkpointing`` from the model's
``sharded_state_dict()`` (global tensors: it loads under another TP size) and the moments sharded as their
parameters are (``optim_state_to_sharding_state``). Beside it, as in the FSDP2 backend's checkpoints:
``trainer_state.json`` (the run's state, the schedule, the optimizer's param groups), ``optimizer.safetensors``
(AdamW's step count of each parameter, by its index), ``rng.safetensors`` and ``hf/`` (config and tokenizer),
so that ``rlx convert-ckpt STEP_DIR/megatron OUT`` turns it into a Hugging Face directory through the
converter's torch_dist path, and ``--resume`` continues the run.

Nothing is pickled by rlx: the torch_dist ``common.pt`` gets no objects (the param groups go into the JSON), and
``.metadata`` (PyTorch's pickle) is checked by the converter's safe unpickler before a load.
Left out: the distributed optimizer's layout, and loading a checkpoint of the FSDP2 backend (refused).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

TORCH_DIST_DIR = "megatron"


def _sharded_optimizer_state(policy, optimizer) -> tuple[dict, dict]:
    """({param id: {exp_avg: ShardedTensor, ...}}, {param id: step, param_groups}) of ``optimizer``'s state."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    state = optimizer.state_dict()
    steps = {str(pid): entry["step"].reshape(1).clone() for pid, entry in state["state"].items()}
    groups = [dict(group) for group in state["param_groups"]]  # the next call wraps the dict's own for megatron
    ids = get_param_id_to_sharded_param_map(policy.module.sharded_state_dict(), list(policy.parameters()))
    optim_state_to_sharding_state(state, ids, exclude_keys=("step",))
    return state["state"], {"steps": steps, "param_groups": groups}


def _save_strategy(device: torch.device):
    """megatron's torch_dist save; on a CPU the converter's, without the CUDA synchronisation around the write."""
    if device.type != "cpu":
        return None  # megatron's default
    from rlx.convert.megatron.runtime import cpu_save_strategy

    return cpu_save_strategy()


def save_checkpoint(
    root: Path,
    step: int,
    policy,
    optimizer,
    scheduler,
    model_path: str,
    trainer_state: dict[str, Any],
    keep: int,
    before_manifest: Callable[[Path], None] | None = None,
) -> Path | None:
    """Every rank calls this (the torch_dist write is collective); rank 0 writes the rest and renames."""
    from megatron.core import dist_checkpointing

    from rlx.formats.checkpoint import fsync_dir, step_dir_name, write_manifest
    from rlx.trainer.checkpoint import _copy_hf_files, _prune, _save_tensors, _write_json

    rank = dist.get_rank()
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-megatron"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / TORCH_DIST_DIR).mkdir(parents=True)
    dist.barrier()
    optim_state, optim_meta = _sharded_optimizer_state(policy, optimizer)
    sharded = {"model": policy.module.sharded_state_dict(), "optimizer": {"state": optim_state}}
    dist_checkpointing.save(sharded, str(tmp / TORCH_DIST_DIR), sharded_strategy=_save_strategy(policy.device))
    dist.barrier()
    if rank != 0:
        return None
    try:
        state = dict(trainer_state, scheduler=scheduler.state_dict(), optimizer_param_groups=optim_meta["param_groups"])
        _save_tensors(optim_meta["steps"], tmp / "optimizer.safetensors")
        _save_tensors({"torch_cpu": torch.get_rng_state()}, tmp / "rng.safetensors")
        _write_json(tmp / "trainer_state.json", state)
        _copy_hf_files(Path(model_path), tmp / "hf")
        if before_manifest is not None:
            before_manifest(tmp)
        dtype = str(next(policy.parameters()).dtype)
        extra = {"model_dtype": dtype, "lora": False, "backend": "megatron", "layout": policy.describe()}
        write_manifest(tmp, step, [f"{TORCH_DIST_DIR}/metadata.json"], extra)
        fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # an earlier run's, passed over by --resume: kept aside, never deleted
        os.replace(final, root / f"corrupt-{final.name}-{os.getpid()}")
    os.replace(tmp, final)
    fsync_dir(root)
    _prune(root, keep)
    return final


def load_checkpoint(ckpt: Path, policy, optimizer, scheduler) -> dict[str, Any]:
    """Restore the weights, AdamW's state, the schedule and the RNG on every rank; return the trainer state."""
    from megatron.core import dist_checkpointing

    from rlx.convert.megatron.runtime import _no_common_strategy, check_metadata_file
    from rlx.formats.checkpoint import verify_checkpoint
    from rlx.trainer.optim import live_implementation

    manifest = verify_checkpoint(ckpt, check_hashes=False)  # hashes were checked when it was chosen
    if manifest.get("backend") != "megatron":
        raise ValueError(
            f"{ckpt} was written by trainer.backend=fsdp2; resume it with trainer.backend=fsdp2 (or convert its "
            "model.safetensors with rlx convert-ckpt and start a new run from it)"
        )
    state = json.loads((ckpt / "trainer_state.json").read_text())
    check_metadata_file(ckpt / TORCH_DIST_DIR)
    for param in policy.parameters():  # the moments' templates: the optimizer has state once it has stepped
        optimizer.state[param] = {
            "step": torch.zeros((), dtype=torch.float32),
            "exp_avg": torch.zeros_like(param),
            "exp_avg_sq": torch.zeros_like(param),
        }
    optim_state, _ = _sharded_optimizer_state(policy, optimizer)
    template = {"model": policy.module.sharded_state_dict(), "optimizer": {"state": optim_state}}
    loaded = dist_checkpointing.load(
        template, str(ckpt / TORCH_DIST_DIR), common_strategy=_no_common_strategy(), validate_access_integrity=False
    )
    policy.module.load_state_dict(loaded["model"])
    steps = load_file(str(ckpt / "optimizer.safetensors"))
    moments = {
        int(pid): {**entry, "step": steps[str(pid)].reshape(())} for pid, entry in loaded["optimizer"]["state"].items()
    }
    groups = live_implementation(state["optimizer_param_groups"], optimizer)
    optimizer.load_state_dict({"state": moments, "param_groups": groups})
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(load_file(str(ckpt / "rng.safetensors"))["torch_cpu"])
    return state
