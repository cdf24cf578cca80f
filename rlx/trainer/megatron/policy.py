"""The policy of ``trainer.backend=megatron``: megatron-core's GPTModel behind the few methods the Trainer calls.

``rlx.trainer.trainer.Trainer`` keeps its step, its losses (``rlx.trainer.algorithms``) and its optimizer; with
this backend its model is a ``MegatronPolicy``, which gives it

- ``logprobs``: completion logprobs and entropy (``rlx.trainer.megatron.logprobs``: vocabulary-parallel);
- ``step_if_finite``: the guarded optimizer step of ``rlx.trainer.optim`` with megatron's gradient bookkeeping:
  the gradients averaged over the data-parallel group, the global norm taken over the model-parallel group
  (each tensor-parallel duplicate, a norm weight, counted once), clipped as ``clip_grad_norm_`` clips;
- ``named_tensors``: the whole model under Hugging Face names for a weight sync (``rlx.trainer.megatron.weights``);
- ``data_parallel``: the rank and size the Trainer splits a step's rows by (tensor-parallel ranks of one
  data-parallel rank run the same rows), and the group its metrics are reduced over;
- ``parameters`` / ``buffers`` / ``train`` / ``eval`` / ``zero_grad`` for the optimizer, the update loop and the
  colocated offload (``rlx.trainer.offload``).

The optimizer is the Trainer's AdamW over this rank's parameters (its state is as sharded as the weights).
Left out, and refused in pre-flight (``rlx.trainer.preflight.check_megatron``): pipeline stages in the update,
context parallelism, the distributed optimizer, LoRA, a reference model, a critic. Checkpoints: torch_dist
(``rlx.trainer.megatron.checkpoint``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlx.trainer.megatron.build import build_gpt_model, layer_spec_name, model_spec
from rlx.trainer.megatron.logprobs import completion_logprobs
from rlx.trainer.megatron.parallel import cpu_forward, init_parallel
from rlx.trainer.megatron.weights import hf_named_tensors, load_hf_weights, qkv_scratch

if TYPE_CHECKING:
    from rlx.config.roles import TrainerRole


class MegatronPolicy:
    def __init__(self, cfg: TrainerRole, device: torch.device) -> None:
        from rlx.convert.safetensors_io import SafetensorsDir

        self.device, self.chunk_size = device, cfg.trainer.logprob_chunk_size
        self.layout = init_parallel(cfg.trainer.megatron, device, cfg.trainer.seed)
        self.spec = model_spec(cfg.model.path, self.layout.tp)
        self.spec_name = layer_spec_name()
        self.module = build_gpt_model(self.spec, self.layout, getattr(torch, cfg.model.dtype), device)
        self.dims = load_hf_weights(self.module, self.spec, cfg.model.path, self.layout.tp, self.layout.tp_rank)
        """Each parameter's tensor-parallel dimension (None: a duplicate on every rank of its group)."""
        self.split = {id(p) for name, p in self.module.named_parameters() if self.dims[name] is not None}
        self.hf_shapes = {name: info.shape for name, info in SafetensorsDir(cfg.model.path).tensors.items()}
        self.scratch: dict[str, list[torch.Tensor]] = {}  # the sync's q/k/v, in its weight arena (sync_scratch)
        self._scratch_names: dict[str, list] = {}

    def describe(self) -> str:
        """The layer spec and the parallel layout, e.g. 'megatron-core GPTModel, local spec, TP=2 PP=1 CP=1 DP=1'."""
        return f"megatron-core GPTModel, {self.spec_name} spec, {self.layout.describe()}"

    @property
    def data_parallel(self) -> tuple[int, int, dist.ProcessGroup | None]:
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group() if self.layout.dp > 1 else None
        return self.layout.dp_rank, self.layout.dp, group

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.module.parameters()

    def buffers(self) -> Iterator[torch.Tensor]:
        return self.module.buffers()

    def train(self, mode: bool = True) -> MegatronPolicy:
        self.module.train(mode)
        return self

    def eval(self) -> MegatronPolicy:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)

    def logprobs(self, mb, temperature: float, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        with cpu_forward(self.device):
            return completion_logprobs(
                self.module, mb, temperature, self.chunk_size, self.spec.vocab_size, entropy_grad=entropy_grad
            )

    def named_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors under Hugging Face names on every rank (a collective: every rank iterates to the end),
        cast to ``dtype`` where given."""
        yield from hf_named_tensors(self.module, self.spec, self.layout, self.dims, self.hf_shapes, dtype, self.scratch)

    def sync_scratch(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """The tensors a sync builds anew (``WeightArena.adopt``): the q, k and v split out of each fused q/k/v,
        where one rank holds the whole model (else its tensors are gathered into new memory anyway)."""
        if self.layout.tp > 1 or self.layout.pp > 1:
            return []
        self._scratch_names = qkv_scratch(self.module, self.spec)
        return [entry for entries in self._scratch_names.values() for entry in entries]

    def use_sync_scratch(self, tensors: list[torch.Tensor]) -> None:
        it = iter(tensors)
        self.scratch = {name: [next(it) for _ in entries] for name, entries in self._scratch_names.items()}

    def step_if_finite(self, optimizer, params: list, max_grad_norm: float, loss_finite: bool, device) -> tuple:
        """``rlx.trainer.optim.step_if_finite`` over this rank's shards: see the module docstring."""
        from megatron.core import parallel_state as ps

        from rlx.trainer.optim import _on_every_rank

        grads = [p.grad for p in params if p.grad is not None]
        _, dp, dp_group = self.data_parallel
        for grad in grads if dp > 1 else ():
            dist.all_reduce(grad, group=dp_group)
            grad.div_(dp)
        counted = [p.grad for p in params if p.grad is not None and (self.layout.tp_rank == 0 or id(p) in self.split)]
        squares = torch.stack([g.detach().float().norm() ** 2 for g in counted]).sum() if counted else torch.zeros(())
        if self.layout.tp * self.layout.pp > 1:
            dist.all_reduce(squares, group=ps.get_model_parallel_group())
        norm = float(squares.sqrt())
        finite = math.isfinite(norm) and _on_every_rank(loss_finite, device)
        if finite:
            if max_grad_norm:
                coef = min(max_grad_norm / (norm + 1e-6), 1.0)
                torch._foreach_mul_(grads, coef)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm, finite
