"""AdamW with linear warm-up, then a constant or cosine learning rate."""

from __future__ import annotations

import math

import torch


def build_optimizer(model, cfg) -> torch.optim.Optimizer:
    t = cfg.trainer
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                             foreach=False)


def lr_factor(step: int, cfg) -> float:
    """Multiplier of trainer.lr after ``step`` optimizer steps."""
    t = cfg.trainer
    if t.warmup_steps and step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    if t.lr_schedule == "constant":
        return 1.0
    span = max(1, t.total_steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
