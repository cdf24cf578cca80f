"""AdamW with linear warm-up, then a constant or cosine learning rate, and the guarded optimizer step:
one whose loss or gradient norm is NaN or inf is skipped, leaving the weights and the optimizer's state
as they were."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from rlx.config.trainer import TrainerConfig

IMPLEMENTATION_KEYS = ("foreach", "fused", "capturable", "differentiable")
"""Param-group keys that say how ``step`` runs its kernels, not what the optimizer has learned."""


def adamw(params, lr: float, t: TrainerConfig) -> torch.optim.AdamW:
    """AdamW with the trainer's betas and weight decay. Fused (one kernel over every parameter, on CPU and
    CUDA, FSDP2's DTensors included) when every parameter is a float tensor on one of those devices, else the
    per-tensor loop. Both compute the same update."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=tuple(t.betas),
        weight_decay=t.weight_decay,
        **({"fused": True} if fused else {"foreach": False}),
    )


def build_optimizer(model, t: TrainerConfig) -> torch.optim.Optimizer:
    return adamw((p for p in model.parameters() if p.requires_grad), t.lr, t)


def step_if_finite(
    optimizer: torch.optim.Optimizer, params: list, max_grad_norm: float, loss_finite: bool, device: torch.device
) -> tuple[float, bool]:
    """Clip the gradients of ``params`` to ``max_grad_norm`` (0 = no clipping) and take the optimizer step,
    unless this rank's loss or the global gradient norm is NaN or inf: then the gradients are dropped and
    nothing else changes. Every rank decides alike (the norm is global; a rank's loss flag is all-reduced).
    Returns the norm and whether the step was taken."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    finite = math.isfinite(norm) and _on_every_rank(loss_finite, device)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, finite


def _on_every_rank(flag: bool, device: torch.device) -> bool:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    unset = torch.tensor([0.0 if flag else 1.0], device=device)
    dist.all_reduce(unset)
    return float(unset) == 0.0


def live_implementation(saved_groups: list[dict], optimizer: torch.optim.Optimizer) -> list[dict]:
    """``saved_groups`` (a checkpoint's param groups) with ``optimizer``'s own implementation flags, so a
    resumed run keeps the kernels it was built with whatever run wrote the checkpoint (loading a state dict
    otherwise takes every group key from the file)."""
    return [
        {**saved, **{k: live[k] for k in IMPLEMENTATION_KEYS if k in live}}
        for saved, live in zip(saved_groups, optimizer.param_groups, strict=True)
    ]


def lr_factor(step: int, t: TrainerConfig) -> float:
    """Multiplier of trainer.lr after ``step`` optimizer steps."""
    if t.warmup_steps and step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    if t.lr_schedule == "constant":
        return 1.0
    span = max(1, t.total_steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer, t: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, t))
