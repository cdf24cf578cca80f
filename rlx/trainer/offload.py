"""Move a trainer's accelerator state to host memory and back (colocated placement).

While the rollout engines on the same GPU generate, the trainer needs none of its parameters,
gradients, optimizer state or reference model there: ``Offloader.offload`` moves them to CPU and
returns the allocator's cached blocks to the device, ``onload`` brings them back before the update.
Parameters keep their identity (``param.data`` is swapped), so the optimizer, the scheduler and any
holder of a parameter see the moved tensor. ``PhasePeaks`` records the allocator's high-water mark of
each phase (``torch.cuda.max_memory_reserved``, reset at each phase start).

On a CPU device both are no-ops that still answer (0 bytes moved, 0 GiB peaks). It leaves out FSDP2
sharded parameters (one trainer rank only, ``placement.offload`` checks it) and pinned staging buffers
(each move allocates host memory; at 0.5B parameters this costs about a second per turn on an H100 host).
"""

from __future__ import annotations

import torch


class Offloader:
    def __init__(
        self, modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer | None, device: torch.device
    ) -> None:
        self.modules = [m for m in modules if m is not None]
        self.optimizer = optimizer
        self.device = device
        self.offloaded = False

    @property
    def active(self) -> bool:
        """Whether moving changes anything: the trainer's device is an accelerator."""
        return self.device.type != "cpu"

    def offload(self) -> int:
        """Parameters, gradients, buffers and optimizer state to CPU; returns the bytes moved."""
        if not self.active or self.offloaded:
            return 0
        moved = self._move(torch.device("cpu"))
        self.offloaded = True
        torch.cuda.empty_cache()  # hand the cached blocks back so the engine can take them
        return moved

    def onload(self) -> int:
        """Everything back to the trainer's device; returns the bytes moved."""
        if not self.active or not self.offloaded:
            return 0
        moved = self._move(self.device)
        self.offloaded = False
        return moved

    def _move(self, device: torch.device) -> int:
        moved = 0
        for module in self.modules:
            for tensor in (*module.parameters(), *module.buffers()):
                moved += _swap(tensor, device)
                if tensor.grad is not None:
                    tensor.grad = tensor.grad.to(device)
                    moved += tensor.grad.nbytes
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.device != device and value.dim() > 0:
                        state[key] = value.to(device)
                        moved += value.nbytes
        return moved


def _swap(tensor: torch.Tensor, device: torch.device) -> int:
    if tensor.device == device:
        return 0
    tensor.data = tensor.data.to(device)
    return tensor.nbytes


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
