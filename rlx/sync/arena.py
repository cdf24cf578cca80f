"""Trainer weights that live in a shared buffer, so a weight sync copies each byte once.

Through slots (``transports``) every byte is copied twice: the sender packs it into a slot and
each receiver copies it out into its engine. When the trainer's parameters themselves sit in a
shared buffer, the sender only says where each tensor is and every receiver copies straight out
of the trainer's memory. Where two concurrent copies share the memory bandwidth (a two-core
machine: each runs at about half speed; a GPU: both copies go through the same HBM), that is the
difference between about half of a plain copy's speed and all of it.

The buffer is the transport's own: POSIX shared memory on the CPU (receivers keep it mapped from
one sync to the next, because mapping a gigabyte costs more than copying it), one CUDA IPC
allocation on a GPU (opened by receivers at each sync, as the slots are). Either way receivers
drop every view at each sync's end.

``WeightArena.adopt(module)`` moves every parameter of a module into one buffer: ``param.data``
points into it, the Parameter objects stay the same, and the optimizer keeps updating them in
place. ``WeightSender(arena=...)`` sends from it whenever every tensor of a sync lies inside it.
Reads never race with updates because of the order of a run: the trainer changes its weights only
between syncs, a sync starts after the device has finished the update (``ready``), and it ends
when every receiver has acknowledged the last bucket.

Left out: sharded ranks (FSDP2 gathers each parameter into new memory, so those syncs go through
slots) and dtype casts (a cast is a copy anyway).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from rlx.sync.layout import ALIGN_BYTES, align_up
from rlx.sync.messages import TransportHandle


class WeightArena:
    def __init__(self, nbytes: int, device: str | torch.device = "cpu"):
        self.size = align_up(max(nbytes, ALIGN_BYTES))
        self.device = torch.device(device)
        if self.device.type == "cuda":
            from rlx.sync.transports.cuda_ipc import CudaIpcBuffer

            self._buffer = CudaIpcBuffer(self.size, 1, str(self.device))
            self.device = self._buffer.device
        else:
            from rlx.sync.transports.shm import ShmBuffer

            self._buffer = ShmBuffer(self.size, 1, resident=True)
        self._bytes = self._buffer.slot(0)
        self._base = self._bytes.data_ptr()
        self._used = 0

    @classmethod
    def sized_for(cls, tensors: Iterable[torch.Tensor], device: str | torch.device) -> WeightArena:
        """An empty arena on ``device`` that ``place`` can fill with copies of ``tensors``."""
        return cls(sum(align_up(t.numel() * t.element_size()) for t in tensors), device)

    @classmethod
    def adopt(cls, module: torch.nn.Module) -> WeightArena:
        """Move every parameter of ``module`` (all on one device) into a new arena on that device.

        A module whose sync sends tensors it builds anew each time (megatron's fused q/k/v, split into the three
        the engine loads) names them with ``sync_scratch() -> [(shape, dtype), ...]``; the arena keeps room for
        them after the parameters and hands the module those tensors (``use_sync_scratch(tensors)``), which it
        fills at every sync, so that the whole sync still lies in the arena."""
        params = list(module.parameters())
        devices = {p.device for p in params}
        if len(devices) != 1:
            raise ValueError(
                f"a weight arena lives on one device; this module has parameters on {sorted(map(str, devices))}"
            )
        scratch = module.sync_scratch() if hasattr(module, "sync_scratch") else []
        nbytes = sum(align_up(p.numel() * p.element_size()) for p in params)
        nbytes += sum(align_up(math.prod(shape) * dtype.itemsize) for shape, dtype in scratch)
        arena = cls(nbytes, devices.pop())
        with torch.no_grad():
            for param in params:
                param.data = arena.place(param.data)
        if scratch:
            module.use_sync_scratch([arena.reserve(shape, dtype) for shape, dtype in scratch])
        return arena

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor in the arena holding a copy of ``tensor``."""
        nbytes = tensor.numel() * tensor.element_size()
        if self._used + nbytes > self.size:
            raise ValueError(f"the weight arena has {self.size - self._used} bytes left, {nbytes} are needed")
        out = self._bytes[self._used : self._used + nbytes].view(tensor.dtype).view(tensor.shape)
        out.copy_(tensor)
        self._used = align_up(self._used + nbytes)
        return out

    def reserve(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor in the arena, for its owner to fill before each sync."""
        nbytes = math.prod(shape) * dtype.itemsize
        if self._used + nbytes > self.size:
            raise ValueError(f"the weight arena has {self.size - self._used} bytes left, {nbytes} are needed")
        out = self._bytes[self._used : self._used + nbytes].view(dtype).view(shape)
        self._used = align_up(self._used + nbytes)
        return out

    def place_all(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        return [(name, self.place(tensor)) for name, tensor in named]

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Byte offset of ``tensor`` in the arena, or ``None`` when it is not wholly inside."""
        if tensor.device != self.device or not tensor.is_contiguous():
            return None
        if tensor.numel() == 0:
            return 0  # no bytes to read; an empty tensor's address is 0 wherever it came from
        offset = tensor.data_ptr() - self._base
        end = offset + tensor.numel() * tensor.element_size()
        return offset if offset >= 0 and end <= self.size and offset % tensor.element_size() == 0 else None

    def ready(self) -> None:
        """Make the weights' latest writes (the optimizer step) visible before receivers read them."""
        self._buffer.ready(0)

    def handle(self) -> TransportHandle:
        return self._buffer.handle()

    def close(self) -> None:
        """Stop sharing: an shm segment loses its name; the memory lives on while the parameters use it."""
        self._buffer.unlink()
        self._bytes = None
