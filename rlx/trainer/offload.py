"""Move a trainer's accelerator state to host memory and back (colocated placement).

While the rollout engines on the same GPU generate, the trainer needs none of its parameters,
gradients, optimizer state or reference model there: ``Offloader.offload`` moves them to CPU and
returns the allocator's cached blocks to the device, ``onload`` brings them back before the update.
Parameters keep their identity (``param.data`` is swapped), so the optimizer, the scheduler and any
holder of a parameter see the moved tensor. ``PhasePeaks`` records the allocator's high-water mark of
each phase (``torch.cuda.max_memory_reserved``, reset at each phase start).

The bytes go through one pinned host buffer, made at the first offload and kept for the run: every tensor
is copied into its own aligned range of it without waiting (``non_blocking``), then the device waits once, and
the tensors live in the buffer (views) until ``onload`` copies them back the same way. Pageable copies, one
host allocation and one wait per tensor, cost about a second per turn at 0.5B parameters on an H100 host. A
buffer larger than ``PIN_FRACTION`` of host memory, or one the driver cannot pin, falls back to a pageable
host copy per tensor (``Offloader.pinned`` says which).

On a CPU device both are no-ops that still answer (0 bytes moved, 0 GiB peaks). It leaves out FSDP2
sharded parameters (one trainer rank only, ``placement.offload`` checks it).
"""

from __future__ import annotations

import functools
import operator
import os

import torch

PIN_FRACTION = 0.25
"""The largest pinned buffer, as a fraction of host memory; beyond it the offload copies tensor by tensor."""
ALIGN = 512  # bytes: each tensor's range in the pinned buffer starts at a multiple of this


class Offloader:
    def __init__(
        self, modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer | None, device: torch.device
    ) -> None:
        self.modules = [m for m in modules if m is not None]
        self.optimizer = optimizer
        self.device = device
        self.offloaded = False
        self.pinned: bool | None = None  # None until the first offload decides
        self._host: torch.Tensor | None = None
        self._moved: list[tuple] = []  # (setter, host copy) of what the last offload moved

    @property
    def active(self) -> bool:
        """Whether moving changes anything: the trainer's device is an accelerator."""
        return self.device.type != "cpu"

    def offload(self) -> int:
        """Parameters, gradients, buffers and optimizer state to CPU; returns the bytes moved."""
        if not self.active or self.offloaded:
            return 0
        slots = [(put, tensor) for put, tensor in self._slots() if tensor.device.type == self.device.type]
        pinned = self._staging(sum(_aligned(t.nbytes) for _, t in slots))
        offset, self._moved = 0, []
        for put, tensor in slots:
            host = _view(self._host, offset, tensor) if pinned else torch.empty_like(tensor, device="cpu")
            host.copy_(tensor, non_blocking=True)
            put(host)
            self._moved.append((put, host))
            offset += _aligned(tensor.nbytes)
        torch.cuda.synchronize(self.device)  # every copy landed before the device memory is handed back
        self.offloaded = True
        torch.cuda.empty_cache()  # hand the cached blocks back so the engine can take them
        return sum(host.nbytes for _, host in self._moved)

    def onload(self) -> int:
        """Everything back to the trainer's device; returns the bytes moved."""
        if not self.active or not self.offloaded:
            return 0
        moved, self._moved = self._moved, []
        for put, host in moved:
            on_device = torch.empty_like(host, device=self.device)
            on_device.copy_(host, non_blocking=True)  # ordered on the stream before any use of it
            put(on_device)
        torch.cuda.synchronize(self.device)  # the pinned buffer is free for the next offload's copies
        self.offloaded = False
        return sum(host.nbytes for _, host in moved)

    def _slots(self) -> list[tuple]:
        """(setter, tensor) of every tensor the trainer holds, in a fixed order: parameters and buffers (``.data``
        swapped: identity kept), their gradients, the optimizer's per-parameter state (its scalar steps stay)."""
        slots, seen = [], set()
        for module in self.modules:
            for tensor in (*module.parameters(), *module.buffers()):
                if id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                slots.append((functools.partial(setattr, tensor, "data"), tensor.data))
                if tensor.grad is not None:
                    slots.append((functools.partial(setattr, tensor, "grad"), tensor.grad))
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        slots.append((functools.partial(operator.setitem, state, key), value))
        return slots

    def _staging(self, nbytes: int) -> bool:
        """Whether the pinned buffer takes ``nbytes`` (made, or grown, here); False: a host copy per tensor."""
        if self.pinned is False:
            return False
        if self._host is not None and self._host.numel() >= nbytes:
            return True
        self._host = None
        if nbytes > PIN_FRACTION * _host_memory():
            self.pinned = False
            return False
        try:
            self._host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:  # the driver could not pin that much: pageable copies from now on
            self.pinned = False
            return False
        self.pinned = True
        return True


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _view(host: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """``like``'s shape and dtype over ``host``'s bytes from ``offset``."""
    return host[offset : offset + like.nbytes].view(like.dtype).view(like.shape)


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class PhasePeaks:
    """High-water mark of this process's accelerator memory per phase, in GiB (zeros on a CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float:
        return torch.cuda.max_memory_reserved() / 2**30 if self.cuda else 0.0

    def now_gb(self) -> float:
        return torch.cuda.memory_reserved() / 2**30 if self.cuda else 0.0
