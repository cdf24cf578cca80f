"""The critic of PPO with ``algorithm.advantage=gae``: a value model, its optimizer, GAE and the value loss.

The value model is its own copy of the policy's trunk (``model.path`` loaded again, the LM head
dropped) with a ``Linear(hidden, 1)`` value head, initialised to zero (every value starts at 0).
A separate copy, not a shared trunk, so the value loss never moves the policy and the critic can
train alone during ``algorithm.critic_warmup_steps`` (as verl's critic worker). The value of
completion token t is read from the hidden state that scores t (the state before t is sampled),
through the same layouts (packed or padded) as the policy's logprobs.

Per step: ``advantages`` computes the values of the batch (no grad), GAE advantages and returns
(``rlx.trainer.algorithms.gae``) and the explained variance; ``update`` takes one AdamW step on the
clipped value loss (PPO2 / verl: 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old +
clip(V - V_old, +-value_clip)), token-mean over the whole batch. ``save`` / ``load`` write the value
model, the optimizer state and the step count into a checkpoint directory as safetensors + JSON.

Left out: several trainer ranks (the critic trains on one: the schema refuses num_ranks > 1),
LoRA critics, and several critic epochs per step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from rlx.trainer.algorithms.gae import gae_advantages
from rlx.trainer.logprobs import _features
from rlx.trainer.optim import adamw, live_implementation, step_if_finite
from rlx.trainer.packing import MicroBatch

if TYPE_CHECKING:
    from rlx.config.algorithm import AlgorithmConfig
    from rlx.config.model import ModelConfig
    from rlx.config.trainer import TrainerConfig

VALUE_FILE = "critic.safetensors"
OPTIMIZER_FILE = "critic_optimizer.safetensors"
STATE_FILE = "critic_state.json"


class ValueModel(torch.nn.Module):
    """The policy architecture's trunk plus a scalar head; ``base_model_prefix`` as in transformers, so the
    logprob code's feature extraction (``_features``) serves it unchanged."""

    base_model_prefix = "model"

    def __init__(self, trunk: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.model = trunk
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def values(self, mb: MicroBatch) -> torch.Tensor:
        """[b, T] values of the micro-batch's completion tokens; 0 where the mask is 0."""
        scored = mb.batch.mask.bool()
        hidden = _features(self, mb, split_head=True)
        values = self.value_head(hidden).squeeze(-1).float()
        return torch.zeros(scored.shape, dtype=values.dtype, device=values.device).masked_scatter(scored, values)


class Critic:
    def __init__(
        self, a: AlgorithmConfig, m: ModelConfig, t: TrainerConfig, device: torch.device, packed_attention: bool
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.algorithm, self.max_grad_norm, self.device = a, t.max_grad_norm, device
        lm = AutoModelForCausalLM.from_pretrained(
            m.path, dtype=getattr(torch, m.dtype), attn_implementation=m.attn_implementation
        )
        lm.config.use_cache = False
        if packed_attention:
            from rlx.trainer.attention import use_packed_attention

            use_packed_attention(lm)
        self.model = ValueModel(lm.model, lm.config.hidden_size).to(device)
        self.optimizer = adamw(self.model.parameters(), a.critic_lr or t.lr, t)
        self.steps = 0
        """Critic updates so far; the policy trains once it reaches algorithm.critic_warmup_steps."""
        self._old_values: torch.Tensor | None = None
        self._returns: torch.Tensor | None = None

    @property
    def warming_up(self) -> bool:
        return self.steps < self.algorithm.critic_warmup_steps

    @torch.no_grad()
    def advantages(
        self, full_mask: torch.Tensor, rewards: torch.Tensor, micro: list[MicroBatch]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token GAE advantages [B, T] of the step batch, and the critic's metrics before its update."""
        a = self.algorithm
        self.model.eval()
        values = torch.zeros(full_mask.shape, dtype=torch.float32)
        for mb in micro:
            if mb.num_tokens:
                values[mb.rows] = self.model.values(mb).cpu()
        advantages, returns = gae_advantages(rewards, values, full_mask, a.gamma, a.lam)
        self._old_values, self._returns = values, returns
        real = full_mask.bool()
        v, r = values[real], returns[real]
        explained = 1.0 - float((r - v).var() / r.var()) if r.numel() > 1 and r.var() > 0 else 0.0
        return advantages, {
            "critic_explained_variance": explained,
            "value_mean": float(v.mean()) if v.numel() else 0.0,
            "return_mean": float(r.mean()) if r.numel() else 0.0,
        }

    def update(self, micro: list[MicroBatch]) -> dict[str, float]:
        """One optimizer step on the clipped value loss over the batch ``advantages`` was last called with."""
        assert self._returns is not None, "Critic.advantages must run before Critic.update"
        clip = self.algorithm.value_clip
        self.model.train()
        total_tokens = max(float(sum(float(mb.batch.mask.sum()) for mb in micro)), 1.0)
        loss_sum = clipped = 0.0
        for mb in micro:
            if not mb.num_tokens:
                continue
            mask = mb.batch.mask.float()
            old = self._old_values[mb.rows].to(mask.device)
            target = self._returns[mb.rows].to(mask.device)
            values = self.model.values(mb)
            loss_tokens = (values - target).square()
            if clip > 0:
                clipped_values = old + (values - old).clamp(-clip, clip)
                clipped_loss = (clipped_values - target).square()
                clipped += float(((clipped_loss > loss_tokens).float() * mask).sum())
                loss_tokens = torch.maximum(loss_tokens, clipped_loss)
            loss = 0.5 * (loss_tokens * mask).sum() / total_tokens
            loss.backward()
            loss_sum += loss.item()
        norm, stepped = step_if_finite(
            self.optimizer, list(self.model.parameters()), self.max_grad_norm, math.isfinite(loss_sum), self.device
        )
        self.steps += 1
        return {
            "value_loss": loss_sum,
            "value_clip_frac": clipped / total_tokens,
            "critic_grad_norm": norm,
            "critic_skipped_nonfinite": float(not stepped),
        }

    def save(self, directory: Path) -> None:
        """Write the value model, its optimizer state and the step count into ``directory``."""
        state = self.optimizer.state_dict()
        tensors = {
            f"{index}::{key}": torch.as_tensor(value).contiguous()
            for index, entry in state["state"].items()
            for key, value in entry.items()
        }
        save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, str(directory / VALUE_FILE))
        save_file(tensors, str(directory / OPTIMIZER_FILE))
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
        (directory / STATE_FILE).write_text(json.dumps({"steps": self.steps, "param_groups": groups}, indent=2))

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote; a checkpoint without a critic is refused with the fix."""
        missing = [name for name in (VALUE_FILE, OPTIMIZER_FILE, STATE_FILE) if not (directory / name).is_file()]
        if missing:
            raise ValueError(
                f"cannot resume algorithm.advantage=gae from {directory}: it has no critic "
                f"({', '.join(missing)} missing; it was saved by a run without a critic); resume with "
                "that run's algorithm.advantage, or start a new run"
            )
        self.model.load_state_dict(load_file(str(directory / VALUE_FILE)))
        saved = json.loads((directory / STATE_FILE).read_text())
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in load_file(str(directory / OPTIMIZER_FILE)).items():
            index, name = key.rsplit("::", 1)
            state.setdefault(int(index), {})[name] = value
        groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in saved["param_groups"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": live_implementation(groups, self.optimizer)})
        self.steps = int(saved["steps"])
