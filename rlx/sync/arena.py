"""Trainer weights that live in POSIX shared memory, so a CPU weight sync copies each byte once.

Through slots (``transports.shm``) every byte is copied twice: the sender packs it into a slot and
each receiver copies it out into its engine. When the trainer's parameters themselves sit in a
shared segment, the sender only says where each tensor is and every receiver copies straight out
of the trainer's memory. Where two concurrent copies share the memory bandwidth (a two-core
machine: each runs at about half speed), that is the difference between about half of a plain
``memmove``'s speed and all of it.

``WeightArena.adopt(module)`` moves every parameter of a module into one segment: ``param.data``
points into it, the Parameter objects stay the same, and the optimizer keeps updating them in
place. ``WeightSender(arena=...)`` sends from it whenever every tensor of a sync lies inside it.
Receivers keep the arena mapped between syncs and drop every view at each sync's end. Reads never
race with updates because of the order of a run: the trainer changes its weights only between
syncs, and a sync ends when every receiver has acknowledged the last bucket.

Left out: sharded ranks (FSDP2 gathers each parameter into new memory, so those syncs go through
slots) and dtype casts (a cast is a copy anyway).
"""

from __future__ import annotations

from typing import Iterable

import torch

from rlx.sync.layout import ALIGN_BYTES, align_up
from rlx.sync.messages import TransportHandle
from rlx.sync.transports.shm import ShmBuffer


class WeightArena:
    def __init__(self, nbytes: int):
        self.size = align_up(max(nbytes, ALIGN_BYTES))
        self._buffer = ShmBuffer(self.size, 1, resident=True)
        self._bytes = self._buffer.slot(0)
        self._base = self._bytes.data_ptr()
        self._used = 0

    @classmethod
    def adopt(cls, module: torch.nn.Module) -> "WeightArena":
        """Move every parameter of ``module`` (CPU, contiguous) into a new arena."""
        params = list(module.parameters())
        bad = [p for p in params if p.device.type != "cpu"]
        if bad:
            raise ValueError(f"a weight arena holds CPU tensors; this module has parameters on {bad[0].device}")
        arena = cls(sum(align_up(p.numel() * p.element_size()) for p in params))
        with torch.no_grad():
            for param in params:
                param.data = arena.place(param.data)
        return arena

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor in the arena holding a copy of ``tensor``."""
        nbytes = tensor.numel() * tensor.element_size()
        if self._used + nbytes > self.size:
            raise ValueError(f"the weight arena has {self.size - self._used} bytes left, {nbytes} are needed")
        out = self._bytes[self._used:self._used + nbytes].view(tensor.dtype).view(tensor.shape)
        out.copy_(tensor)
        self._used = align_up(self._used + nbytes)
        return out

    def place_all(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        return [(name, self.place(tensor)) for name, tensor in named]

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Byte offset of ``tensor`` in the arena, or ``None`` when it is not wholly inside."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return None
        if tensor.numel() == 0:
            return 0  # no bytes to read; an empty tensor's address is 0 wherever it came from
        offset = tensor.data_ptr() - self._base
        end = offset + tensor.numel() * tensor.element_size()
        return offset if 0 <= offset and end <= self.size and offset % tensor.element_size() == 0 else None

    def handle(self) -> TransportHandle:
        return self._buffer.handle()

    def close(self) -> None:
        """Unlink the segment; its memory lives on while tensors (the parameters) use it."""
        self._buffer.unlink()
        self._bytes = None
