"""megatron-core's parallel state over the trainer's ranks, and its forward pass on a CPU.

``init_parallel`` joins megatron's tensor / pipeline / context / data-parallel groups to the process group the
trainer ranks already share (``rlx.trainer.ranks.init_distributed``); a trainer of one rank gets a process group
of its own first (an in-process store, no port; gloo on a CPU, NCCL for CUDA tensors on a GPU, as several ranks
use). ``Layout`` is what the rest of the backend reads of it:
this rank's place in each group.

``cpu_forward`` is for the CPU: megatron-core's forward asks CUDA for two things that have a CPU answer, the
device its rotary table moves to (``torch.cuda.current_device``) and the RNG tracker that forks a CUDA generator
around attention dropout (rlx builds the model without dropout, so there is nothing to fork). On CUDA it does
nothing. Left out: virtual pipeline stages, expert parallelism.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from rlx.config.megatron import MegatronConfig


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def describe(self) -> str:
        return f"TP={self.tp} PP={self.pp} CP={self.cp} DP={self.dp}"


def init_parallel(m: MegatronConfig, device: torch.device, seed: int = 0) -> Layout:
    """megatron's groups for ``m``'s sizes over every trainer rank (data parallel: what is left); on CUDA also the
    RNG tracker's generators, seeded by ``seed``, which megatron-core's attention forks around its dropout."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on a CPU
        from megatron.core import parallel_state as ps
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=m.tensor_parallel,
        pipeline_model_parallel_size=m.pipeline_parallel,
        context_parallel_size=m.context_parallel,
        create_gloo_process_groups=False,
    )
    if device.type == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return Layout(
        tp=m.tensor_parallel,
        pp=m.pipeline_parallel,
        cp=m.context_parallel,
        dp=ps.get_data_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
    )


@contextlib.contextmanager
def cpu_forward(device: torch.device) -> Iterator[None]:
    """Run megatron-core's forward (and backward) on the CPU: see the module docstring."""
    if device.type != "cpu":
        yield
        return
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    current_device, fork = torch.cuda.current_device, tracker.fork
    torch.cuda.current_device = lambda: "cpu"
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.current_device, tracker.fork = current_device, fork
