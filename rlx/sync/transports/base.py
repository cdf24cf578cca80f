"""The transport interface: a buffer of equal slots, written by the sender, mapped by receivers.

A transport only places bytes; ordering (which slot may be written when) belongs to the sender
and the acknowledgements. Each implementation lives in its own module and is chosen by name in
``rlx.sync.transports.create_buffer`` / ``map_buffer``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from rlx.sync.messages import TransportHandle


class SenderBuffer(ABC):
    """The sender's side: owns the memory; ``close`` frees it."""

    slot_bytes: int
    num_slots: int

    @abstractmethod
    def slot(self, index: int) -> torch.Tensor:
        """A 1-D uint8 tensor over slot ``index``."""

    @abstractmethod
    def ready(self, index: int) -> None:
        """Make the writes to slot ``index`` visible to receivers before its meta is sent."""

    @abstractmethod
    def handle(self) -> TransportHandle:
        """What a receiver needs to map this buffer."""

    def unlink(self) -> None:
        """Stop new receivers from opening the buffer by name (shm); existing mappings stay valid.
        Buffers without a name have nothing to do."""

    @abstractmethod
    def close(self) -> None:
        """Free the buffer; idempotent."""


class ReceiverMapping(ABC):
    """A receiver's view of a sender's buffer; ``close`` unmaps it."""

    handle: TransportHandle
    keep_mapped: bool = False  # a resident buffer: kept mapped between syncs (``release_views`` at each end)

    @abstractmethod
    def slot(self, index: int) -> torch.Tensor:
        """A 1-D uint8 tensor over slot ``index`` (valid until ``close``)."""

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
