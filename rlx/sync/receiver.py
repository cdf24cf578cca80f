"""Receiver side of weight sync: maps the sender's buffer and hands out each bucket's tensors.

``rlx.sync.handler.SyncHandler`` (the one dispatcher every host uses) calls, per sync::

    receiver.begin(req)                      # SyncBegin: map the buffer
    for each SyncBucket:
        named = receiver.tensors(meta)       # views into the slot (copies only for split tensors)
        model.load_weights(named)            # consume them
        reply(receiver.ack(meta))            # only now may the sender reuse the slot
    reply(receiver.end(req))                 # SyncEnd: drop every view, unmap, then report

Every chunk is checked against the slot bounds, its dtype and its tensor's size before any byte
is read, and split tensors must arrive in order; a bad bucket raises ``ValueError`` (reply with
``fail``). ``end`` fails when tensors are incomplete, when fewer tensors arrived than announced,
or when the consumer still holds views into the buffer. A resident buffer (``rlx.sync.arena``, the
trainer's weights in shared memory) stays mapped from one sync to the next; its views are dropped
all the same. This module leaves out sockets, the error path (``handler``) and what loading means
(the consumer).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from rlx.sync.checksum import tensor_checksum
from rlx.sync.dtypes import dtype_from_name
from rlx.sync.messages import (
    NO_ID,
    PROTOCOL_VERSION,
    BucketAck,
    BucketMeta,
    SyncBegin,
    SyncEnd,
    TensorChunk,
)
from rlx.sync.transports import map_buffer
from rlx.sync.transports.base import ReceiverMapping

AssembleInto = Callable[[str, torch.dtype, list[int], torch.device], "torch.Tensor | None"]


class _Partial(NamedTuple):
    tensor: torch.Tensor
    flat: torch.Tensor  # uint8 view of ``tensor``
    received: int


class WeightReceiver:
    """One receiver of one sender's syncs.

    ``assemble_into(name, dtype, shape, device)`` may return a contiguous tensor of that dtype,
    shape and device (e.g. the parameter itself, when it takes the bytes as they are) for a split
    tensor to be
    assembled in place; ``tensors()`` then returns that very tensor, saving one copy. Returning
    ``None`` (or passing no callable) assembles into a fresh tensor. With a transport that moves
    bytes (``gloo`` / ``nccl``) every tensor it names a destination for is received straight into
    it, so the consumer finds its bytes already in place.
    """

    def __init__(self, name: str = "receiver", assemble_into: AssembleInto | None = None):
        self.name = name
        self._assemble_into = assemble_into
        self._mapping: ReceiverMapping | None = None  # the buffer of the sync in progress
        self._resident: ReceiverMapping | None = None  # a sender's arena, kept mapped across syncs
        self._sync: SyncBegin | None = None
        self._partial: dict[str, _Partial] = {}
        self._views: list[tuple[str, torch.Tensor]] = []
        self._bucket: tuple[int, int, int] | None = None  # sync_id, bucket_id, slot
        self._num_tensors = 0
        self._num_bytes = 0

    @property
    def verifying(self) -> bool:
        """Whether the sync in progress asked for checksums."""
        return self._sync is not None and self._sync.verify

    def begin(self, req: SyncBegin) -> None:
        _check_version(req.version)
        self._reset_sync()
        if self._mapping is not None and self._mapping.handle != req.handle:
            self._release_mapping()
        if self._mapping is None:
            self._mapping = self._mapped(req)
        self._sync = req

    def _mapped(self, req: SyncBegin) -> ReceiverMapping:
        """The kept mapping when ``req`` names the arena mapped before; else a new mapping, which
        replaces the kept one when it is an arena too."""
        if self._resident is not None and self._resident.handle == req.handle:
            return self._resident
        mapping = map_buffer(req.handle)
        if mapping.keep_mapped:
            if self._resident is not None:
                self._resident.close()
            self._resident = mapping
        return mapping

    def tensors(self, meta: BucketMeta) -> list[tuple[str, torch.Tensor]]:
        self._require(meta.sync_id)
        handle = self._mapping.handle
        if not 0 <= meta.slot < handle.num_slots:
            raise ValueError(f"bucket {meta.bucket_id} names slot {meta.slot}; the buffer has {handle.num_slots}")
        self._bucket = (meta.sync_id, meta.bucket_id, meta.slot)
        pieces, out = [], []
        for chunk in meta.chunks:
            dtype = _check_chunk(chunk, handle.slot_bytes)
            land, done = self._landing(chunk, dtype, meta.slot)
            pieces.append((chunk.offset, land))
            if done is not None:
                out.append((chunk.name, done))
                self._num_tensors += 1
                self._num_bytes += chunk.total_nbytes
        self._mapping.fetch(meta.slot, pieces)
        self._views = out
        return out

    @property
    def mapping(self) -> ReceiverMapping | None:
        """The transport mapping of the sync in progress (``None`` between syncs)."""
        return self._mapping

    def ack(self, meta: BucketMeta, loaded_checksums: dict[str, int] | None = None) -> BucketAck:
        """Acknowledge ``meta`` once the consumer is done with its tensors; drops the views."""
        self._require(meta.sync_id)
        if self._bucket != (meta.sync_id, meta.bucket_id, meta.slot):
            raise ValueError(f"ack for bucket {meta.bucket_id} of sync {meta.sync_id}, but the tensors handed out "
                             f"were of {self._bucket and self._bucket[:2]}; call tensors(meta) first")
        checksums = None
        if self._sync.verify:
            checksums = loaded_checksums if loaded_checksums is not None else \
                {name: tensor_checksum(t) for name, t in self._views}
        self._mapping.done_reading(meta.slot)
        self._views, self._bucket = [], None
        return BucketAck(meta.sync_id, meta.bucket_id, ok=True, checksums=checksums)

    def fail(self, sync_id: int, bucket_id: int, error: str) -> BucketAck:
        """A failed bucket's reply: drops the views (after pending reads finish) and reports."""
        if self._mapping is not None and self._bucket is not None:
            self._mapping.done_reading(self._bucket[2])
        self._views, self._bucket = [], None
        return BucketAck(sync_id, bucket_id, ok=False, error=f"{self.name}: {error}")

    def end(self, req: SyncEnd) -> BucketAck:
        """Release every view and mapping but a resident one (the sender may then free or change its
        buffer) and report."""
        _check_version(req.version)
        errors = self._end_errors(req.sync_id)
        self._reset_sync()
        self._sync = None
        try:
            self._release_mapping()
        except BufferError as exc:
            errors.append(str(exc))
        return BucketAck(req.sync_id, NO_ID, ok=not errors, error="; ".join(f"{self.name}: {e}" for e in errors))

    def close(self) -> None:
        """Drop all state and unmap (the host is shutting down)."""
        self._reset_sync()
        self._sync = None
        self._release_mapping()
        if self._resident is not None:
            self._resident.close()
            self._resident = None

    def _end_errors(self, sync_id: int) -> list[str]:
        if self._sync is None or self._sync.sync_id != sync_id:
            current = None if self._sync is None else self._sync.sync_id
            return [f"SyncEnd for sync {sync_id}, but the sync in progress is {current}"]
        errors = []
        if self._partial:
            errors.append(f"split tensors incomplete at the end of the sync: {', '.join(sorted(self._partial))}")
        expected = self._sync.num_tensors
        if expected >= 0 and expected != self._num_tensors:
            errors.append(f"received {self._num_tensors} tensors, the sync announced {expected}")
        return errors

    def _landing(self, chunk: TensorChunk, dtype: torch.dtype, slot: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where ``chunk``'s bytes go (a uint8 tensor) and the tensor it completes, if any: a view of the
        slot, or -- for a split tensor, or any tensor when the transport moves bytes and the consumer
        names a destination -- the destination itself."""
        if chunk.nbytes != chunk.total_nbytes:
            return self._assemble(chunk, dtype)
        direct = self._named_target(chunk, dtype) if self._mapping.moves_bytes else None
        if direct is not None:
            return direct.reshape(-1).view(torch.uint8), direct
        raw = self._mapping.slot(slot)[chunk.offset:chunk.offset + chunk.nbytes]
        return raw, raw.view(dtype).view(chunk.shape)

    def _assemble(self, chunk: TensorChunk, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        partial = self._partial.get(chunk.name)
        if partial is None:
            if chunk.chunk_start != 0:
                raise ValueError(f"chunk of tensor {chunk.name!r} at byte {chunk.chunk_start} arrived before its start")
            target = self._named_target(chunk, dtype)
            if target is None:
                target = torch.empty(chunk.shape, dtype=dtype, device=self._mapping.device)
            partial = _Partial(target, target.reshape(-1).view(torch.uint8), 0)
        if chunk.chunk_start != partial.received:
            raise ValueError(f"chunk of tensor {chunk.name!r} at byte {chunk.chunk_start} arrived out of order "
                             f"(expected byte {partial.received})")
        land = partial.flat[chunk.chunk_start:chunk.chunk_start + chunk.nbytes]
        received = partial.received + chunk.nbytes
        if received == chunk.total_nbytes:
            del self._partial[chunk.name]
            return land, partial.tensor
        self._partial[chunk.name] = partial._replace(received=received)
        return land, None

    def _named_target(self, chunk: TensorChunk, dtype: torch.dtype) -> torch.Tensor | None:
        """The consumer's own destination for ``chunk``'s tensor (``assemble_into``), checked; or ``None``."""
        device = self._mapping.device
        target = self._assemble_into(chunk.name, dtype, chunk.shape, device) if self._assemble_into else None
        if target is None:
            return None
        if (target.dtype != dtype or list(target.shape) != chunk.shape or target.device != device
                or not target.is_contiguous()):
            raise ValueError(f"assemble_into gave {tuple(target.shape)} {target.dtype} on {target.device} for tensor "
                             f"{chunk.name!r}, which needs a contiguous {tuple(chunk.shape)} {dtype} on {device}")
        return target

    def _require(self, sync_id: int) -> None:
        if self._sync is None or self._mapping is None:
            raise ValueError(f"bucket of sync {sync_id} arrived before its SyncBegin")
        if sync_id != self._sync.sync_id:
            raise ValueError(f"bucket of sync {sync_id} arrived during sync {self._sync.sync_id}")

    def _reset_sync(self) -> None:
        self._views, self._bucket = [], None
        self._partial.clear()
        self._num_tensors = self._num_bytes = 0

    def _release_mapping(self) -> None:
        """Unmap the sync's buffer; an arena only loses its views (mapping it again costs more than a sync)."""
        mapping, self._mapping = self._mapping, None
        if mapping is not None and mapping.keep_mapped:
            mapping.release_views()
        elif mapping is not None:
            mapping.close()


def _check_version(version: int) -> None:
    if version != PROTOCOL_VERSION:
        raise ValueError(f"sync protocol version {version} from the sender, this receiver speaks "
                         f"{PROTOCOL_VERSION}; run the same rlx version on both sides")


def _check_chunk(chunk: TensorChunk, slot_bytes: int) -> torch.dtype:
    dtype = dtype_from_name(chunk.dtype)
    itemsize = dtype.itemsize
    expected = math.prod(chunk.shape) * itemsize
    if chunk.total_nbytes != expected or min(chunk.shape, default=0) < 0:
        raise ValueError(f"tensor {chunk.name!r}: shape {chunk.shape} of {chunk.dtype} is {expected} bytes, "
                         f"the chunk says {chunk.total_nbytes}")
    if chunk.offset < 0 or chunk.nbytes < 0 or chunk.offset + chunk.nbytes > slot_bytes or chunk.offset % itemsize:
        raise ValueError(f"tensor {chunk.name!r}: bytes [{chunk.offset}, {chunk.offset + chunk.nbytes}) are not an "
                         f"aligned range of a {slot_bytes}-byte slot")
    if chunk.chunk_start < 0 or chunk.chunk_start + chunk.nbytes > chunk.total_nbytes:
        raise ValueError(f"tensor {chunk.name!r}: chunk [{chunk.chunk_start}, +{chunk.nbytes}) lies outside its "
                         f"{chunk.total_nbytes} bytes")
    return dtype
