"""The trainer role: scores a step's batch, computes advantages and updates the policy.

Every rank calls ``step`` with the same full batch (rank 0 broadcasts it) and computes the
same plan of micro-batches (``rlx.trainer.packing``): token-balanced packed sequences, or
row-count padded micro-batches, with the same count on every rank so FSDP2's collectives line
up. Losses are normalised by the counts of the whole batch (``LossAgg``), so the update does
not depend on the number of ranks or micro-batches.

The old logprobs (the policy before this step's update) need their own pass only when they
differ from what the update's forward computes, or are needed before it: with several epochs, a
reference model or a teacher, or dropout (the update runs in train mode). Otherwise (one epoch,
no reference model, no dropout) there is no optimizer step between the two, so the update's own
logprobs, detached, are exactly the old ones and the pass is skipped. That holds for stale samples
too (one_step_off, fully_async): the policy that sampled them is a third one, whose logprobs the
engine returned (``rollout_logp``); rollout correction weighs each token by old / rollout, both
known in the update's forward.
Groups whose advantages are all zero (every reward of the prompt equal) stay out of the update's
forward and backward when nothing else in the loss reads them (``rows_with_signal``): the gradient
is the same, and the update's metrics (entropy, clip fractions, ratios) cover the rows it trained.
An optimizer step whose loss or gradient norm is NaN or inf is skipped (``optim.step_if_finite``): the
weights, the optimizer's state and the learning-rate schedule stay as they were, ``skipped_nonfinite``
counts it, and the controller stops the run after ``trainer.max_nonfinite_steps`` such steps in a row.
It leaves out data, rollout and weight transfer: the controller does those.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlx.formats.experts import per_expert
from rlx.placement import set_cpu_threads
from rlx.trace import tracer
from rlx.trainer.algorithms.advantages import compute_advantages
from rlx.trainer.algorithms.aggregation import LossAgg
from rlx.trainer.algorithms.correction import ratio_anchor, rollout_correction
from rlx.trainer.algorithms.kl import kl_estimate, kl_penalized_rewards
from rlx.trainer.algorithms.policy_loss import policy_loss
from rlx.trainer.batch import TrainBatch
from rlx.trainer.critic import Critic
from rlx.trainer.distill import distill_advantages, make_teacher
from rlx.trainer.logprobs import can_split_head, completion_logprobs
from rlx.trainer.memory import names_the_fix
from rlx.trainer.model import (
    full_named_parameters,
    has_dropout,
    load_model,
    resolve_device,
)
from rlx.trainer.optim import build_optimizer, build_scheduler, step_if_finite
from rlx.trainer.packing import MicroBatch, micro_batches

if TYPE_CHECKING:
    from rlx.config.roles import TrainerRole


class Trainer:
    def __init__(self, cfg: TrainerRole) -> None:
        self.cfg = cfg
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.device = resolve_device(cfg.trainer.device)
        set_cpu_threads(cfg.trainer.cpu_threads, self.device)
        packed = cfg.trainer.micro_batch_tokens > 0
        self.megatron = cfg.trainer.backend == "megatron"
        self.group = None
        """The group metrics are reduced over: every rank (None), or the data-parallel ranks (Megatron)."""
        if self.megatron:  # megatron-core's GPTModel behind the methods used here (rlx.trainer.megatron.policy)
            from rlx.trainer.megatron.policy import MegatronPolicy

            self.model = MegatronPolicy(cfg, self.device)
            self.rank, self.world, self.group = self.model.data_parallel
        else:
            self.model = load_model(
                cfg.model, self.device, packed_attention=packed, fused_kernels=cfg.trainer.fused_kernels
            )
        self.ref_model = (
            load_model(cfg.model, self.device, trainable=False, packed_attention=packed)
            if cfg.algorithm.kl_coef > 0
            else None
        )
        self.critic = (
            Critic(cfg.algorithm, cfg.model, cfg.trainer, self.device, packed)
            if cfg.algorithm.advantage == "gae"
            else None
        )
        self.teacher = make_teacher(
            cfg.algorithm.distill, cfg.teacher_auth_token, cfg.trainer.logprob_chunk_size, self.device
        )  # on-policy distillation (rlx.trainer.distill)
        self.optimizer = build_optimizer(self.model, cfg.trainer)
        self.scheduler = build_scheduler(self.optimizer, cfg.trainer)
        self.sampling = cfg.sampling
        """What the trainer must agree with of how the engines sampled: group size, temperature, length."""
        self.temperature = self.sampling.logprob_temperature
        self.split_head = self.world == 1 and not self.megatron and can_split_head(self.model)
        self.fused_logprobs = (
            cfg.trainer.epochs_per_step == 1
            and self.ref_model is None
            and self.teacher is None
            and (self.megatron or not has_dropout(self.model))
        )
        """The update's detached logprobs are the old ones (see the module docstring)."""
        a = cfg.algorithm
        self.skip_no_signal = (
            cfg.trainer.skip_no_signal
            and self.ref_model is None
            and self.critic is None
            and self.teacher is None
            and not a.entropy_coef
        )
        """Rows whose advantage is zero give the loss nothing: they stay out of the update (``rows_with_signal``)."""
        self.routing = None
        """MoE routes (``algorithm.routing_replay`` record or r3): the engine's experts replayed or compared."""
        if a.routing_replay != "off":
            from rlx.trainer.moe import Routing

            self.routing = Routing.install(self.model, replay=a.routing_replay == "r3")

    def warm_up(self) -> float:
        """One forward and backward pass of the policy on a small batch of random tokens (``warm_pass``): on
        CUDA the first pass compiles the logprob kernels (``torch.compile``) and loads the fused ones, about ten
        seconds that the launcher spends while the engines load rather than in the first step. Single-rank CUDA
        trainers only (several ranks would run FSDP2's collectives); returns the seconds it took (0.0 where it
        does nothing)."""
        if self.device.type != "cuda" or self.world > 1 or self.megatron:
            return 0.0
        started = time.perf_counter()
        with tracer.span("warm_up"):
            self.warm_pass()
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started

    def warm_pass(self) -> int:
        """A scoring pass and a forward and backward pass of the policy, as a step makes them, on two samples of
        random tokens; the weights, gradients (none after it) and optimizer state stay as they were. Returns
        the completion tokens it scored."""
        from rlx.store.base import Sample
        from rlx.trainer.batch import collate

        vocab = self.model.get_input_embeddings().num_embeddings
        tokens = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
        samples = [Sample.of(row[:8], row[8:].tolist(), [0.0] * 16) for row in tokens]
        (mb,) = micro_batches(collate(samples, 0), 0, 1, self.cfg.trainer.micro_batch_tokens, 2)
        mb = mb.to(self.device)
        with torch.no_grad():
            self._logprobs(self.model, mb)
        entropy_grad = bool(self.cfg.algorithm.entropy_coef)
        logp, entropy = self._logprobs(self.model, mb, entropy_grad=entropy_grad)
        ((logp + entropy if entropy_grad else logp) * mb.batch.mask).sum().backward()
        self.model.zero_grad(set_to_none=True)
        return int(mb.batch.mask.sum())

    def named_tensors(self):
        """Full parameters for weight sync, in the engine dtype; all ranks must iterate. With LoRA, the
        merged weights of a plain model under the base model's names, or with ``model.lora.sync=adapter`` only
        the adapter's factors, in the trainer's dtype (``rlx.trainer.lora``). Fused expert tensors go as one
        tensor per expert, the checkpoint's names and layout (``rlx.formats.experts``)."""
        dtype = getattr(torch, self.cfg.model.engine_dtype)
        if self.cfg.lora_sync == "adapter":
            from rlx.trainer.lora import adapter_named_tensors

            yield from adapter_named_tensors(self.model)
            return
        if self.megatron:
            tensors = self.model.named_tensors(dtype)
        elif self.cfg.model.lora.rank:
            from rlx.trainer.lora import merged_named_tensors

            tensors = merged_named_tensors(self.model)
        else:
            tensors = full_named_parameters(self.model)
        for name, tensor in tensors:
            for part_name, part in per_expert(name, tensor):
                yield part_name, part.to(dtype)

    def step(self, full: TrainBatch) -> dict[str, float]:
        a, t = self.cfg.algorithm, self.cfg.trainer
        rows = advantages = None
        if self.skip_no_signal:  # the advantages need no forward pass: know them first, plan only what trains
            advantages, metrics = self._advantages(full, [])
            rows, metrics["groups_no_signal"] = rows_with_signal(advantages, self.sampling.n)
        with tracer.span("train.micro_batches"):
            micro = [
                mb.to(self.device)
                for mb in micro_batches(
                    full,
                    self.rank,
                    self.world,
                    t.micro_batch_tokens,
                    t.micro_batch_size,
                    self.sampling.n,
                    t.share_prompts and not self.megatron,  # megatron's padded rows each carry their prompt
                    rows,
                )
            ]
        start = time.perf_counter()
        if not self.fused_logprobs:
            with tracer.span("logprob", rows=sum(mb.batch.size for mb in micro)), self._oom("scoring pass"):
                self._score(micro)
        time_logprob = time.perf_counter() - start
        if advantages is None:
            advantages, metrics = self._advantages(full, micro)
        if self.routing is not None and not self.routing.replay:
            metrics.update(self._replayed_mismatch(micro))
        for mb in micro:
            mb.batch.advantages = advantages[mb.rows].to(self.device)
        agg = LossAgg(
            a.loss_agg,
            global_tokens=float(full.mask.sum()),
            global_seqs=float(full.size),
            max_len=self.sampling.max_tokens,
        )
        start = time.perf_counter()
        with self._oom("update"):
            if self.critic is None or not self.critic.warming_up:  # critic warm-up: only the critic trains
                metrics.update(self._update(micro, agg))
            if self.critic is not None:
                metrics.update(self.critic.update(micro))
                metrics["skipped_nonfinite"] = (
                    metrics.get("skipped_nonfinite", 0.0) + metrics["critic_skipped_nonfinite"]
                )
        metrics["time_update"] = time.perf_counter() - start
        metrics["time_logprob"] = time_logprob
        if self.routing is not None:
            metrics.update(self.routing.take_metrics())
        return metrics

    def _oom(self, phase: str):
        """Out of memory in ``phase``: a one-line error naming the keys that fit the step (``rlx.trainer.memory``)."""
        return names_the_fix(self.cfg, self.device, phase)

    def _advantages(self, full: TrainBatch, micro: list[MicroBatch]) -> tuple[torch.Tensor, dict[str, float]]:
        """[B] or per-token [B, T] advantages (the estimator, or GAE with the critic; then distillation), and
        their metrics."""
        a, metrics = self.cfg.algorithm, {}
        rewards = self._shaped_rewards(full, micro)
        if self.critic is not None:
            advantages, metrics = self.critic.advantages(full.mask, rewards, micro)
        else:
            advantages = compute_advantages(a.advantage, rewards, self.sampling.n)
        if self.teacher is not None:
            with tracer.span("teacher_logprob", rows=full.size):
                advantages, distilled = distill_advantages(
                    self.teacher, full, micro, advantages, a.distill.coef, a.distill.reward_coef
                )
            metrics.update(distilled)
        return advantages, metrics

    def save_extra(self, directory) -> None:
        """Write what a checkpoint holds beside the policy (the critic) into the staged ``directory``."""
        if self.critic is not None:
            self.critic.save(directory)

    def load_extra(self, directory) -> None:
        if self.critic is not None:
            self.critic.load(directory)

    @torch.no_grad()
    def _score(self, micro: list[MicroBatch]) -> None:
        """Fill ``old_logp`` (and ``ref_logp``) with the current weights, before any update."""
        self.model.eval()
        for mb in micro:
            mb.batch.old_logp = self._logprobs(self.model, mb)[0]
            if self.ref_model is not None:
                split = self.world == 1 and can_split_head(self.ref_model)
                mb.batch.ref_logp = self._logprobs(self.ref_model, mb, split_head=split)[0]

    def _logprobs(self, model, mb: MicroBatch, split_head: bool | None = None, entropy_grad: bool = False):
        if self.megatron:
            return model.logprobs(mb, self.temperature, entropy_grad=entropy_grad)
        split_head = self.split_head if split_head is None else split_head
        routed = contextlib.nullcontext()
        if self.routing is not None and model is self.model:
            from rlx.trainer.moe import batch_routes

            routed = self.routing.tokens(batch_routes(mb))
        with routed:
            return completion_logprobs(
                model,
                mb,
                self.temperature,
                self.cfg.trainer.logprob_chunk_size,
                split_head=split_head,
                entropy_grad=entropy_grad,
            )

    @torch.no_grad()
    def _replayed_mismatch(self, micro: list[MicroBatch]) -> dict[str, float]:
        """algorithm.routing_replay=record: ``logprob_diff_mean_replayed``, the |dlogp| of the same tokens with the
        engine's routes replayed (one more forward per micro-batch, before the update), beside
        ``logprob_diff_mean``'s without them."""
        self.model.eval()
        total = tokens = 0.0
        self.routing.replay = True
        try:
            for mb in micro:
                logp = self._logprobs(self.model, mb)[0]
                total += float(((logp - mb.batch.rollout_logp).abs() * mb.batch.mask).sum())
                tokens += float(mb.batch.mask.sum())
        finally:
            self.routing.replay = False
        return self._reduce({"logprob_diff_mean_replayed": total}, tokens)

    def _shaped_rewards(self, full: TrainBatch, micro: list[MicroBatch]) -> torch.Tensor:
        """Rewards [B]; with KL in the reward, minus each sequence's KL penalty (summed over ranks)."""
        a = self.cfg.algorithm
        if not (a.kl_in_reward and self.ref_model is not None):
            return full.rewards.clone()
        penalty = torch.zeros(full.size, dtype=torch.float32, device=self.device)
        for mb in (mb for mb in micro if mb.num_tokens):
            b = mb.batch
            shaped = kl_penalized_rewards(b.rewards, b.old_logp, b.ref_logp, b.mask, a.kl_coef, a.kl_estimator)
            penalty[mb.rows.to(self.device)] = (b.rewards - shaped).float()
        if self.world > 1:
            dist.all_reduce(penalty, group=self.group)
        return full.rewards - penalty.cpu()

    def _update(self, micro: list[MicroBatch], agg: LossAgg) -> dict[str, float]:
        t = self.cfg.trainer
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        tokens = seen = 0.0
        norms, skipped = [], 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        guarded_step = self.model.step_if_finite if self.megatron else step_if_finite
        for _ in range(t.epochs_per_step):  # one optimizer step per pass: later passes see updated weights
            loss_finite = True
            for mb in micro:
                with tracer.span("update.micro_batch", rows=mb.batch.size, tokens=mb.num_tokens):
                    loss, stats = self._micro_batch_loss(mb, agg)
                    (loss * self.world).backward()  # FSDP2 averages gradients over ranks; the loss is a global sum
                mb_tokens = float(mb.batch.mask.sum())
                tokens += mb_tokens
                seen += mb.num_tokens
                loss_value = loss.item()
                sums["loss"] += loss_value
                loss_finite = loss_finite and math.isfinite(loss_value)
                for key, value in stats.items():
                    sums[key] += value * mb_tokens
            with tracer.span("optimizer_step"):
                norm, stepped = guarded_step(self.optimizer, params, t.max_grad_norm, loss_finite, self.device)
            norms.append(norm)
            skipped += not stepped
        if skipped < t.epochs_per_step:  # the schedule counts RL steps that updated the weights
            self.scheduler.step()
        metrics = self._reduce({k: v for k, v in sums.items() if k != "loss"}, tokens)
        totals = self._reduce({"loss": sums["loss"], "update_tokens": seen}, 1.0 if self.rank == 0 else 0.0)
        metrics["loss"] = totals["loss"] / t.epochs_per_step
        metrics["update_tokens"] = totals["update_tokens"]  # real prompt + completion tokens through forward+backward
        metrics["grad_norm"] = sum(norms) / len(norms)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["skipped_nonfinite"] = float(skipped)
        return metrics

    def _micro_batch_loss(self, mb: MicroBatch, agg: LossAgg):
        a, b = self.cfg.algorithm, mb.batch
        logp, entropy = self._logprobs(self.model, mb, entropy_grad=bool(a.entropy_coef))
        old_logp = logp.detach() if self.fused_logprobs else b.old_logp
        weights, stats = rollout_correction(
            old_logp,
            b.rollout_logp,
            b.mask,
            method=self.cfg.correction,
            level=a.correction_level,
            tis_cap=a.tis_cap,
            icepop_low=a.icepop_low,
            icepop_high=a.icepop_high,
        )
        anchor = ratio_anchor(self.cfg.correction, old_logp, b.rollout_logp)
        loss, loss_stats = policy_loss(
            a.policy_loss,
            logp,
            anchor,
            b.advantages,
            b.mask,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            weights=weights,
            agg=agg,
        )
        stats.update(loss_stats)
        denom = b.mask.sum().clamp(min=1.0)
        stats["entropy"] = float((entropy.detach() * b.mask).sum() / denom)
        if a.entropy_coef:
            loss = loss - a.entropy_coef * agg(entropy, b.mask)
        if b.ref_logp is not None:
            kl = kl_estimate(logp, b.ref_logp, a.kl_estimator)
            stats["kl"] = float((kl.detach() * b.mask).sum() / denom)
            if not a.kl_in_reward:
                loss = loss + a.kl_coef * agg(kl, b.mask)
        return loss, stats

    def _reduce(self, sums: dict[str, float], weight: float) -> dict[str, float]:
        """Weighted means over ranks of per-rank weighted sums."""
        keys = sorted(sums)
        values = torch.tensor([sums[k] for k in keys] + [weight], dtype=torch.float64)
        if self.world > 1:
            values = values.to(self.device)
            dist.all_reduce(values, group=self.group)
            values = values.cpu()
        total = max(float(values[-1]), 1e-12)
        return {k: float(v) / total for k, v in zip(keys, values[:-1], strict=True)}


def rows_with_signal(advantages: torch.Tensor, group_size: int) -> tuple[list[int], float]:
    """The rows of the groups (``group_size`` consecutive rows) that have a nonzero advantage, and the fraction
    of groups left out. With only the policy loss (no KL, entropy bonus, critic or teacher), a token's loss is
    its advantage times a function of its ratio, so a group whose advantages are all zero (every reward equal)
    adds zero to the loss and to every gradient; the loss's normalisation still counts its tokens
    (``LossAgg`` takes the whole batch's counts), so the update is the same without its forward and backward.
    When no group has a signal, the first is kept: the optimizer still steps, on zero gradients, as it would."""
    groups = advantages.detach().reshape(-1, group_size) != 0
    signal = groups.any(dim=1)
    keep = signal.nonzero().flatten().tolist() or [0]
    rows = [g * group_size + i for g in keep for i in range(group_size)]
    return rows, 1.0 - float(signal.float().mean())
