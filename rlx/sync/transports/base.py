"""The transport interface: a buffer of equal slots, written by the sender, mapped by receivers.

A transport only places bytes; ordering (which slot may be written when) belongs to the sender
and the acknowledgements. Each implementation lives in its own module and is chosen by name in
``rlx.sync.transports.create_buffer`` / ``map_buffer``. Shared buffers (shm, cuda_ipc) are written
by the sender and read in place; a transport that moves bytes (``dist``) sends each chunk from its
source tensor (``sends_from_source``) and receives it where the receiver says (``fetch``).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

import torch

from rlx.sync.copy import copy_bytes
from rlx.sync.messages import TransportHandle


class SenderBuffer(ABC):
    """The sender's side: owns the memory; ``close`` frees it."""

    slot_bytes: int
    num_slots: int
    sends_from_source: bool = False  # chunks go out with ``send_chunk`` instead of being copied into a slot
    reusing: bool = False  # this sync's handles name what the receivers kept from the last one (a broadcast group)

    @abstractmethod
    def slot(self, index: int) -> torch.Tensor:
        """A 1-D uint8 tensor over slot ``index``."""

    @abstractmethod
    def ready(self, index: int) -> None:
        """Make the writes to slot ``index`` visible to receivers before its meta is sent."""

    @abstractmethod
    def handle(self) -> TransportHandle:
        """What a receiver needs to map this buffer."""

    def handles(self, peers: list[str], fresh: bool = False) -> list[TransportHandle]:
        """One handle per receiver (``peers``: their addresses) for the sync that starts now; ``fresh``: nothing
        kept from an earlier sync (a receiver lost it)."""
        return [self.handle()] * len(peers)

    async def connect(self, begun: list[asyncio.Task]) -> None:  # noqa: B027 - a no-op unless the transport overrides it
        """Wait until the receivers can take bytes, while ``begun`` (their SyncBegin calls) run; a
        shared buffer has nothing to wait for (the sender checks ``begun`` before the first meta)."""

    def send_chunk(self, source: torch.Tensor, offset: int) -> None:
        """Start sending ``source`` (1-D uint8), the next chunk of the bucket, whose place in the bucket's
        slot layout is ``offset`` (``sends_from_source``)."""
        raise NotImplementedError(f"{type(self).__name__} copies chunks into its slots")

    def post(self, index: int) -> None:  # noqa: B027 - a no-op unless the transport overrides it
        """Slot ``index``'s meta is on the wire: a transport that moves bytes starts sending its chunks now
        (a shared buffer's receivers read in place: nothing to do)."""

    async def end_sync(self) -> None:  # noqa: B027 - a no-op unless the transport overrides it
        """The sync ended well (every receiver acknowledged SyncEnd); nothing to do for a shared buffer."""

    def unlink(self) -> None:  # noqa: B027 - a no-op unless the transport overrides it
        """Stop new receivers from opening the buffer by name (shm); existing mappings stay valid.
        Buffers without a name have nothing to do."""

    @abstractmethod
    def close(self) -> None:
        """Free the buffer; idempotent."""


class ReceiverMapping(ABC):
    """A receiver's view of a sender's buffer; ``close`` unmaps it."""

    handle: TransportHandle
    device: torch.device = torch.device("cpu")
    moves_bytes: bool = False  # bytes arrive in ``fetch``, so chunks may land straight in their destinations
    keep_mapped: bool = False  # a resident buffer: kept mapped between syncs (``release_views`` at each end)

    @abstractmethod
    def slot(self, index: int) -> torch.Tensor:
        """A 1-D uint8 tensor over slot ``index`` (valid until ``close``)."""

    def fetch(self, index: int, pieces: list[tuple[int, torch.Tensor]]) -> None:
        """Make each ``(offset in slot index, destination)`` hold its chunk's bytes; a destination
        that is the slot range itself has nothing to do (the zero-copy view of a shared buffer)."""
        slot = self.slot(index)
        for offset, dst in pieces:
            src = slot[offset : offset + dst.numel()]
            if dst.numel() and dst.data_ptr() != src.data_ptr():
                copy_bytes(dst, src)

    @abstractmethod
    def done_reading(self, index: int) -> None:
        """Block until every read of slot ``index`` issued so far has finished (before an ack)."""

    def release_views(self) -> None:
        """Drop the tensors over the mapping but keep it mapped (``keep_mapped`` buffers only);
        raises ``BufferError`` when the consumer still holds one."""
        raise NotImplementedError(f"{type(self).__name__} is not kept mapped between syncs")

    @abstractmethod
    def close(self) -> None:
        """Unmap; raises ``BufferError`` when tensors over the mapping are still referenced."""
