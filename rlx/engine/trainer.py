"""The trainer role: scores a step's batch, computes advantages and updates the policy.

Every rank calls ``step`` with the same full batch (rank 0 broadcasts it); each rank takes
its contiguous share of rows and runs the same number of micro-batches, so FSDP2's
collectives line up. Losses are normalised by the counts of the whole batch
(``LossAgg``), so the update does not depend on the number of ranks or micro-batches.
It leaves out data, rollout and weight transfer: the controller does those.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist

from rlx.engine.algorithms.advantages import compute_advantages
from rlx.engine.algorithms.aggregation import LossAgg
from rlx.engine.algorithms.correction import rollout_correction
from rlx.engine.algorithms.kl import kl_estimate, kl_penalized_rewards
from rlx.engine.algorithms.policy_loss import policy_loss
from rlx.engine.batch import TrainBatch, pad_rows
from rlx.engine.logprobs import completion_logprobs
from rlx.engine.model import full_named_parameters, load_model, resolve_device
from rlx.engine.optim import build_optimizer, build_scheduler
from rlx.trace import tracer


class Trainer:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.device = resolve_device(cfg.trainer.device)
        self.model = load_model(cfg, self.device)
        self.ref_model = load_model(cfg, self.device, trainable=False) if cfg.algorithm.kl_coef > 0 else None
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0

    def named_tensors(self):
        """Full parameters for weight sync / checkpoints, in the engine dtype; all ranks must iterate."""
        dtype = getattr(torch, self.cfg.model.engine_dtype)
        for name, tensor in full_named_parameters(self.model):
            yield name, tensor.to(dtype)

    def step(self, full: TrainBatch) -> dict[str, float]:
        a = self.cfg.algorithm
        num_real = full.size
        padded = pad_rows(full, self.world)
        share = padded.size // self.world
        local = padded.rows(slice(self.rank * share, (self.rank + 1) * share)).to(self.device)
        start = time.perf_counter()
        with tracer.span("logprob", rows=local.size):
            self._score(local)
        time_logprob = time.perf_counter() - start
        rewards = self._shaped_rewards(padded, local)[:num_real]
        advantages = compute_advantages(a.advantage, rewards, self.cfg.rollout.n)
        advantages = torch.cat([advantages, advantages.new_zeros(padded.size - num_real)])
        local.advantages = advantages[self.rank * share:(self.rank + 1) * share].to(self.device)
        weights, correction = rollout_correction(
            local.old_logp, local.rollout_logp, local.mask, method=self.cfg.correction, level=a.correction_level,
            tis_cap=a.tis_cap, icepop_low=a.icepop_low, icepop_high=a.icepop_high)
        agg = LossAgg(a.loss_agg, global_tokens=float(full.mask.sum()), global_seqs=float(num_real),
                      max_len=self.cfg.rollout.max_tokens)
        start = time.perf_counter()
        metrics = self._update(local, weights, agg)
        metrics["time_update"] = time.perf_counter() - start
        metrics["time_logprob"] = time_logprob
        tokens = float(local.mask.sum())
        metrics.update(self._reduce({k: v * tokens for k, v in correction.items()}, tokens))
        return metrics

    @torch.no_grad()
    def _score(self, batch: TrainBatch) -> None:
        """Fill ``old_logp`` (and ``ref_logp``) with the current weights, before any update."""
        self.model.eval()
        old, ref = [], []
        for mb in self._micro_batches(batch):
            old.append(completion_logprobs(self.model, mb, self.temperature, self.cfg.trainer.logprob_chunk_size)[0])
            if self.ref_model is not None:
                ref.append(completion_logprobs(self.ref_model, mb, self.temperature,
                                               self.cfg.trainer.logprob_chunk_size)[0])
        batch.old_logp = torch.cat(old)
        batch.ref_logp = torch.cat(ref) if ref else None

    def _shaped_rewards(self, padded: TrainBatch, local: TrainBatch) -> torch.Tensor:
        a = self.cfg.algorithm
        rewards = padded.rewards.clone()
        if not (a.kl_in_reward and local.ref_logp is not None):
            return rewards
        local_shaped = kl_penalized_rewards(local.rewards, local.old_logp, local.ref_logp, local.mask,
                                            a.kl_coef, a.kl_estimator).float()
        if self.world == 1:
            return local_shaped.cpu()
        gathered = [torch.empty_like(local_shaped) for _ in range(self.world)]
        dist.all_gather(gathered, local_shaped)
        return torch.cat(gathered).cpu()

    def _update(self, batch: TrainBatch, weights, agg: LossAgg) -> dict[str, float]:
        a, t = self.cfg.algorithm, self.cfg.trainer
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        tokens = seen = 0.0
        for _ in range(t.epochs_per_step):
            for index, mb in self._micro_batches(batch, with_index=True):
                mb_weights = weights[index] if weights is not None else None
                with tracer.span("update.micro_batch", rows=mb.size):
                    loss, stats = self._micro_batch_loss(mb, mb_weights, agg)
                    (loss * self.world).backward()  # FSDP2 averages gradients over ranks; the loss is a global sum
                mb_tokens = float(mb.mask.sum())
                tokens += mb_tokens
                seen += float(mb.attention_mask.sum())
                sums["loss"] += loss.item()
                for key, value in stats.items():
                    sums[key] += value * mb_tokens
        with tracer.span("optimizer_step"):
            grad_norm = self._optimizer_step()
        metrics = self._reduce({k: v for k, v in sums.items() if k != "loss"}, tokens)
        totals = self._reduce({"loss": sums["loss"], "update_tokens": seen}, 1.0 if self.rank == 0 else 0.0)
        metrics["loss"] = totals["loss"] / t.epochs_per_step
        metrics["update_tokens"] = totals["update_tokens"]  # prompt + completion tokens through forward+backward
        metrics["grad_norm"] = grad_norm
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _micro_batch_loss(self, mb: TrainBatch, weights, agg: LossAgg):
        a = self.cfg.algorithm
        logp, entropy = completion_logprobs(self.model, mb, self.temperature, self.cfg.trainer.logprob_chunk_size,
                                            with_entropy=True)
        loss, stats = policy_loss(a.policy_loss, logp, mb.old_logp, mb.advantages, mb.mask, clip_low=a.clip_low,
                                  clip_high=a.clip_high, dual_clip=a.dual_clip, weights=weights, agg=agg)
        mask = mb.mask
        denom = mask.sum().clamp(min=1.0)
        stats = dict(stats)
        stats["entropy"] = float((entropy.detach() * mask).sum() / denom)
        if a.entropy_coef:
            loss = loss - a.entropy_coef * agg(entropy, mask)
        if mb.ref_logp is not None:
            kl = kl_estimate(logp, mb.ref_logp, a.kl_estimator)
            stats["kl"] = float((kl.detach() * mask).sum() / denom)
            if not a.kl_in_reward:
                loss = loss + a.kl_coef * agg(kl, mask)
        return loss, stats

    def _optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.cfg.trainer.max_grad_norm or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _micro_batches(self, batch: TrainBatch, with_index: bool = False):
        size = self.cfg.trainer.micro_batch_size
        for start in range(0, batch.size, size):
            index = slice(start, start + size)
            yield (index, batch.rows(index)) if with_index else batch.rows(index)

    def _reduce(self, sums: dict[str, float], weight: float) -> dict[str, float]:
        """Weighted means over ranks of per-rank weighted sums."""
        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys] + [weight], dtype=torch.float64)
        if self.world > 1:
            values = values.to(self.device)
            dist.all_reduce(values)
            values = values.cpu()
        total = max(float(values[-1]), 1e-12)
        return {k: float(v) / total for k, v in zip(keys, values[:-1])}
