"""A trainer that runs out of memory says which keys make its step fit, in one line.

``names_the_fix(cfg, device, phase)`` wraps the passes of a step that hold activations (the scoring pass, the
update): an allocator failure inside them (CUDA's ``torch.OutOfMemoryError``; on a CPU the allocator's
"can't allocate memory") becomes ``TrainerOutOfMemory``, whose message says where it happened, what the device
held (CUDA: allocated, reserved, total), and the keys that shrink the step's peak with their values now:
``trainer.micro_batch_tokens`` (or ``trainer.micro_batch_size`` for padded rows), ``model.gradient_checkpointing``
and ``trainer.logprob_chunk_size``. The original error stays chained (``from``) for the log's traceback.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlx.config.roles import TrainerRole

CPU_ALLOCATOR_FAILED = "can't allocate memory"


class TrainerOutOfMemory(RuntimeError):
    """A step's pass ran out of device memory; the message names the keys that make it fit."""


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and CPU_ALLOCATOR_FAILED in str(exc)
    )


def gpu_memory(device: torch.device) -> str:
    """What this process's allocator holds of the GPU, and what the GPU has free (every process counted):
    '61.2 GiB allocated, 63.0 reserved, 12.0 free of 139.8'."""
    gib = 2**30
    allocated, reserved = torch.cuda.memory_allocated(device) / gib, torch.cuda.memory_reserved(device) / gib
    free, total = (b / gib for b in torch.cuda.mem_get_info(device))
    return f"{allocated:.1f} GiB allocated, {reserved:.1f} reserved, {free:.1f} free of {total:.1f}"


def held(device: torch.device) -> str:
    """Where, and what the device's allocator held: 'on the GPU (61.2 GiB allocated, ...)'."""
    return f"on the GPU ({gpu_memory(device)})" if device.type == "cuda" else "on the CPU"


def fix(cfg: TrainerRole) -> str:
    """The keys that lower a step's peak, with their values now."""
    t, m = cfg.trainer, cfg.model
    size = (
        f"a smaller trainer.micro_batch_tokens (now {t.micro_batch_tokens})"
        if t.micro_batch_tokens > 0
        else f"a smaller trainer.micro_batch_size (now {t.micro_batch_size} padded rows)"
    )
    steps = [size]
    if not m.gradient_checkpointing:
        steps.append("model.gradient_checkpointing=true (each layer's activations recomputed in the backward)")
    steps.append(f"a smaller trainer.logprob_chunk_size (now {t.logprob_chunk_size})")
    return ", ".join(steps[:-1]) + f" or {steps[-1]}"


@contextlib.contextmanager
def names_the_fix(cfg: TrainerRole, device: torch.device, phase: str):
    try:
        yield
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        if not is_out_of_memory(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if len(first) > 200:
            first = first[:200] + "..."
        where = held(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise TrainerOutOfMemory(
            f"the trainer ran out of memory in the {phase} {where}: {first}. To fit the step: {fix(cfg)}"
        ) from exc
