"""The trainer's AdamW runs fused, takes the per-tensor loop's steps, and keeps its kernels across a resume from
a checkpoint that a per-tensor optimizer wrote."""

from __future__ import annotations

import pytest
import torch

from rlx.config.model import ModelConfig
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlx.trainer.optim import build_optimizer, build_scheduler


def config(model_dir) -> RunConfig:
    return RunConfig(model=ModelConfig(path=str(model_dir)), trainer=TrainerConfig(lr=1e-2, weight_decay=0.1))


def load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


def steps(model, optimizer, first: int, count: int) -> None:
    """``count`` optimizer steps on gradients fixed by the step index."""
    for step in range(first, first + count):
        generator = torch.Generator().manual_seed(step)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def assert_same_weights(a, b) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)


def test_the_fused_optimizer_takes_the_per_tensor_loops_steps(tiny_model_dir):
    cfg = config(tiny_model_dir)
    fused_model, loop_model = load(tiny_model_dir), load(tiny_model_dir)
    fused = build_optimizer(fused_model, cfg.trainer)
    loop = torch.optim.AdamW(
        loop_model.parameters(),
        lr=cfg.trainer.lr,
        betas=tuple(cfg.trainer.betas),
        weight_decay=cfg.trainer.weight_decay,
        foreach=False,
    )
    assert fused.param_groups[0]["fused"] is True
    steps(fused_model, fused, 0, 4)
    steps(loop_model, loop, 0, 4)
    assert_same_weights(fused_model, loop_model)
    assert not torch.equal(next(fused_model.parameters()), next(load(tiny_model_dir).parameters()))


def test_a_checkpoint_of_the_per_tensor_loop_resumes_fused_and_continues_the_run(tmp_path, tiny_model_dir):
    cfg = config(tiny_model_dir)
    earlier = load(tiny_model_dir)
    optimizer = torch.optim.AdamW(
        earlier.parameters(),
        lr=cfg.trainer.lr,
        betas=tuple(cfg.trainer.betas),
        weight_decay=cfg.trainer.weight_decay,
        foreach=False,
    )  # as earlier versions built it
    scheduler = build_scheduler(optimizer, cfg.trainer)
    steps(earlier, optimizer, 0, 2)
    ckpt = save_checkpoint(
        tmp_path / "checkpoints", 2, earlier, optimizer, scheduler, str(tiny_model_dir), {"step": 2, "data": {}}, keep=2
    )
    steps(earlier, optimizer, 2, 2)

    resumed = load(tiny_model_dir)
    fused = build_optimizer(resumed, cfg.trainer)
    load_checkpoint(ckpt, resumed, fused, build_scheduler(fused, cfg.trainer))
    group = fused.param_groups[0]
    assert (group["fused"], group["foreach"]) == (True, None), "the checkpoint's flags replaced the optimizer's own"
    assert group["weight_decay"] == pytest.approx(0.1) and group["lr"] == pytest.approx(1e-2)
    steps(resumed, fused, 2, 2)
    assert_same_weights(resumed, earlier)
