"""Sender side of weight sync: streams named tensors through a double-buffered shared buffer.

Per sync: ``SyncBegin`` (the buffer's handle) to every receiver -- they map the buffer while the
first bucket is filled, and its meta goes out once all of them have -- then for bucket k: wait until
every receiver acknowledged the last bucket that used slot k % num_buffers, copy bucket k into
that slot, send its ``BucketMeta`` to all receivers at once; finally ``SyncEnd``, whose acks say
every receiver has released its mapping. With two slots the copy of bucket k+1 overlaps the
receivers' loading of bucket k; with one it is lock-step.

The copies run on the event loop's own thread, which yields after each bucket so that its requests
go out at once (a hop to a worker thread per bucket cost 5-10% of throughput on a two-core
machine); a sync therefore keeps the loop busy, which is what the trainer is doing meanwhile
anyway (generation is paused around an update). A cancelled sync never leaves a copy running.

A transport that moves bytes (``gloo`` / ``nccl``: a torch.distributed broadcast, across hosts) has
no slots: each receiver gets its own handle (its rank in the sync's group), the sender joins the group
while the receivers handle SyncBegin (``connect``), and "filling" a bucket posts one broadcast per
chunk straight from its source tensor; the acks and the window work as above.

Tensors that already live in a ``WeightArena`` (the trainer's own weights in the transport's shared
buffer, one rank) are not copied at all: the buckets say where each tensor sits in the arena, at most
``num_buffers`` buckets are in flight, and each receiver copies straight out of the trainer's memory.

Correct by construction: a slot is written only after all acks of its previous bucket; every ack
is awaited with a deadline naming the peer; a failed sync frees the buffer, so a receiver still
reading a stale bucket never sees it overwritten (the next sync maps a new buffer). The buffer
is kept between syncs and reused while its slots are large enough. This module leaves out the
wire (``SyncChannel``) and the bytes' home (``transports``).
"""

from __future__ import annotations

import asyncio
import collections.abc
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import torch

from rlx.sync.channel import SyncChannel
from rlx.sync.checksum import tensor_checksum
from rlx.sync.copy import memmove_at
from rlx.sync.dtypes import dtype_name
from rlx.sync.errors import SyncError
from rlx.sync.factory import pick_transport
from rlx.sync.layout import (
    ALIGN_BYTES,
    Bucket,
    TensorSpec,
    align_up,
    pack_buckets,
    resident_buckets,
)
from rlx.sync.messages import (
    NO_ID,
    BucketAck,
    BucketMeta,
    SyncBegin,
    SyncBucket,
    SyncEnd,
    request_label,
)
from rlx.sync.transports import SHARED_TRANSPORTS, create_buffer
from rlx.sync.transports.base import SenderBuffer
from rlx.trace import tracer

if TYPE_CHECKING:
    from rlx.sync.arena import WeightArena

MiB = 1 << 20
# (bucket_id, bucket) -> (slot named in its meta, checksums of the tensors it completes or None)
Prepare = Callable[[int, Bucket], "tuple[int, dict[str, int] | None]"]

log = logging.getLogger(__name__)


class SyncReport(msgspec.Struct):
    sync_id: int
    # "shm" / "cuda_ipc" through slots, "gloo" / "nccl" by broadcast; "shm-arena" / "cuda_ipc-arena" from a WeightArena
    transport: str
    num_buffers: int
    slot_bytes: int
    num_receivers: int
    num_tensors: int
    num_buckets: int
    total_bytes: int
    seconds: float
    verified: bool  # every tensor's checksum matched on every receiver

    @property
    def gb_per_s(self) -> float:
        return self.total_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def zero_copy(self) -> bool:
        """Sent from a ``WeightArena``: no slot, no copy on the sender."""
        return self.transport.endswith("-arena")


class _Source(NamedTuple):
    tensor: torch.Tensor
    flat: torch.Tensor  # uint8 view of the contiguous tensor
    address: int | None  # of its first byte when on the CPU: the fill copies by address


class WeightSender:
    def __init__(
        self,
        transport: str = "shm",
        bucket_mb: int = 64,
        num_buffers: int = 2,
        timeout_s: float = 120.0,
        verify: bool = False,
        device: str = "cpu",
        arena: WeightArena | None = None,
    ):
        if bucket_mb < 1:
            raise ValueError(
                f"bucket_mb={bucket_mb} must be >= 1; set sync.bucket_mb to the transfer bucket size in MiB"
            )
        if num_buffers < 1:
            raise ValueError(f"num_buffers={num_buffers} must be >= 1 (2 = double buffering, 1 = lock-step)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0; set sync.timeout_s to the per-bucket ack deadline")
        self.transport = pick_transport(transport, device)
        if arena is not None and self.transport not in SHARED_TRANSPORTS:
            raise ValueError(
                f"a weight arena is shared memory; transport {self.transport} sends from the tensors "
                "themselves already (set sync.zero_copy=false or use shm / cuda_ipc)"
            )
        self.bucket_bytes = bucket_mb * MiB
        self.num_buffers, self.timeout_s, self.verify, self.device = num_buffers, timeout_s, verify, device
        self.arena = arena  # tensors inside it are sent where they are, without a copy
        self._buffer: SenderBuffer | None = None
        self._sync_id = 0
        self._busy = False

    async def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], channels: list[SyncChannel]) -> SyncReport:
        """Transfer ``named_tensors`` to every channel's receiver; raises ``SyncError`` /
        ``SyncTimeout`` naming the peer (and tensor) when any receiver fails or falls silent."""
        if not channels:
            raise ValueError("send() needs at least one SyncChannel to a receiver")
        if self._busy:
            raise RuntimeError("WeightSender.send() is already running; await it before the next sync")
        self._busy = True
        try:
            return await self._send(named_tensors, list(channels))
        finally:
            self._busy = False

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None

    def __enter__(self) -> WeightSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def _send(self, named_tensors, channels: list[SyncChannel]) -> SyncReport:
        self._sync_id += 1
        sync_id, start = self._sync_id, time.perf_counter()
        if self.arena is not None:
            named_tensors = list(named_tensors)
            offsets = [self.arena.offset_of(t.detach()) for _, t in named_tensors]
            if None not in offsets:
                return await self._send_resident(sync_id, start, named_tensors, offsets, channels)
        named_tensors, num_tensors, total_bytes, packed_bytes = _announce(named_tensors)
        slot_bytes = self.bucket_bytes if packed_bytes < 0 else min(self.bucket_bytes, max(packed_bytes, ALIGN_BYTES))
        buffer = self._ensure_buffer(slot_bytes)
        peers = [getattr(ch, "address", ch.name) for ch in channels]

        def begin(handles: list) -> list[asyncio.Task]:
            return [
                asyncio.create_task(self._call(ch, SyncBegin(sync_id, h, num_tensors, total_bytes, self.verify), None))
                for ch, h in zip(channels, handles, strict=True)
            ]

        # receivers map the buffer while the first bucket is being filled; its meta waits for them
        begun = begin(buffer.handles(peers))
        if buffer.reusing:  # a kept group: quick begins; a receiver that lost it (it restarted) takes a new one now
            try:
                await _settle(list(begun))
            except SyncError as exc:
                log.info("a receiver does not hold the kept group (%s); forming a new one", exc)
                self._sync_id += 1
                sync_id = self._sync_id
                begun = begin(buffer.handles(peers, fresh=True))
        await asyncio.sleep(0)  # SyncBegin goes out before the first copy
        pending: dict[str, _Source] = {}
        counts: collections.Counter = collections.Counter()

        def fill(bucket_id: int, bucket: Bucket) -> tuple[int, dict | None]:
            slot = bucket_id % buffer.num_slots
            checksums = self._fill(buffer, slot, bucket, pending)
            _forget_finished(bucket, pending)
            return slot, checksums

        buckets = pack_buckets(self._sources(named_tensors, pending, counts), buffer.slot_bytes)
        try:
            await buffer.connect(begun)
            await self._stream(sync_id, buckets, fill, buffer.num_slots, channels, counts, begun, buffer.post)
            await self._broadcast(SyncEnd(sync_id), channels)
            await buffer.end_sync()
        except BaseException:
            self.close()  # never overwrite bytes a slow receiver might still be reading
            await _cancel(begun)
            raise
        return SyncReport(
            sync_id,
            self.transport,
            self.num_buffers,
            buffer.slot_bytes,
            len(channels),
            counts["tensors"],
            counts["buckets"],
            counts["bytes"],
            time.perf_counter() - start,
            verified=self.verify,
        )

    async def _send_resident(
        self,
        sync_id: int,
        start: float,
        named: list[tuple[str, torch.Tensor]],
        offsets: list[int],
        channels: list[SyncChannel],
    ) -> SyncReport:
        """Every tensor already sits in the arena: the buckets say where; nothing is copied here."""
        tensors = {name: tensor.detach() for name, tensor in named}
        if len(tensors) != len(named):
            raise ValueError("a tensor name appears twice in one sync; names must be unique")
        placed = [
            (TensorSpec(name, dtype_name(t.dtype), list(t.shape), t.numel() * t.element_size()), offset)
            for (name, t), offset in zip(tensors.items(), offsets, strict=True)
        ]
        counts = collections.Counter(tensors=len(placed), bytes=sum(spec.nbytes for spec, _ in placed))
        self.arena.ready()
        begin = SyncBegin(sync_id, self.arena.handle(), counts["tensors"], counts["bytes"], self.verify)
        begun = [asyncio.create_task(self._call(ch, begin, None)) for ch in channels]

        def checksums_only(bucket_id: int, bucket: Bucket) -> tuple[int, dict | None]:
            return 0, {c.name: tensor_checksum(tensors[c.name]) for c in bucket.chunks} if self.verify else None

        await self._stream(
            sync_id,
            resident_buckets(placed, self.bucket_bytes),
            checksums_only,
            self.num_buffers,
            channels,
            counts,
            begun,
        )
        await self._broadcast(SyncEnd(sync_id), channels)
        return SyncReport(
            sync_id,
            f"{begin.handle.kind}-arena",
            self.num_buffers,
            self.arena.size,
            len(channels),
            counts["tensors"],
            counts["buckets"],
            counts["bytes"],
            time.perf_counter() - start,
            verified=self.verify,
        )

    async def _stream(
        self,
        sync_id: int,
        buckets: Iterator[Bucket],
        prepare: Prepare,
        window: int,
        channels: list[SyncChannel],
        counts: collections.Counter,
        begun: list[asyncio.Task],
        post: Callable[[int], None] | None = None,
    ) -> None:
        """Send each bucket once every receiver acknowledged the bucket ``window`` places before it
        (the one that last used its slot); ``prepare`` fills it and names its slot, ``post`` starts moving
        its bytes once its meta is on the wire."""
        inflight: list[list[asyncio.Task]] = [[] for _ in range(window)]
        try:
            for bucket_id, bucket in enumerate(buckets):
                waiting = inflight[bucket_id % window]
                await self._wait_for_slot(waiting)
                slot, checksums = prepare(bucket_id, bucket)
                await _settle(begun)  # every receiver has mapped the buffer
                meta = BucketMeta(sync_id, bucket_id, slot, bucket.chunks, bucket.is_last, checksums)
                waiting += [asyncio.create_task(self._call(ch, SyncBucket(meta), checksums)) for ch in channels]
                counts["buckets"] += 1
                await asyncio.sleep(0)  # the new calls put the bucket's request on the wire before the next copy
                if post is not None:
                    post(slot)
            await _settle(begun)
            for tasks in inflight:
                await _settle(tasks)
        finally:
            tasks = begun + [t for slot_tasks in inflight for t in slot_tasks]
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_for_slot(self, tasks: list[asyncio.Task]) -> None:
        """Block until every receiver acknowledged the last bucket in this slot (the invariant
        that makes reuse safe); raises its first failure."""
        await _settle(tasks)

    async def _broadcast(self, request, channels: list[SyncChannel]) -> None:
        await _settle([asyncio.create_task(self._call(ch, request, None)) for ch in channels])

    def _sources(self, named_tensors, pending: dict[str, _Source], counts: collections.Counter) -> Iterator[TensorSpec]:
        seen: set[str] = set()
        for name, tensor in named_tensors:
            if name in seen:
                raise ValueError(f"tensor {name!r} appears twice in one sync; names must be unique")
            seen.add(name)
            t = tensor.detach()
            t = t if t.is_contiguous() else t.contiguous()
            flat = t.reshape(-1).view(torch.uint8)
            pending[name] = _Source(t, flat, flat.data_ptr() if flat.device.type == "cpu" else None)
            counts["tensors"] += 1
            counts["bytes"] += flat.numel()
            yield TensorSpec(name, dtype_name(t.dtype), list(t.shape), flat.numel())

    def _fill(self, buffer: SenderBuffer, slot: int, bucket: Bucket, pending: dict[str, _Source]) -> dict | None:
        """Copy one bucket into ``slot``; return checksums of the tensors it completes when verifying."""
        with tracer.span("sync.pack", slot=slot, bytes=sum(c.nbytes for c in bucket.chunks)):
            dst = None if buffer.sends_from_source else buffer.slot(slot)
            base = dst.data_ptr() if dst is not None and dst.device.type == "cpu" else None
            checksums = {} if self.verify else None
            for c in bucket.chunks:
                source = pending[c.name]
                if buffer.sends_from_source:
                    buffer.send_chunk(source.flat[c.chunk_start : c.chunk_start + c.nbytes], c.offset)
                elif base is not None and source.address is not None:  # CPU to CPU: one memmove, no views
                    if c.offset + c.nbytes > buffer.slot_bytes or c.chunk_start + c.nbytes > source.flat.numel():
                        raise SyncError(f"bucket layout error: chunk of {c.name!r} does not fit its slot or tensor")
                    memmove_at(base + c.offset, source.address + c.chunk_start, c.nbytes)
                else:
                    dst[c.offset : c.offset + c.nbytes].copy_(source.flat[c.chunk_start : c.chunk_start + c.nbytes])
                if self.verify and c.chunk_start + c.nbytes == c.total_nbytes:
                    checksums[c.name] = tensor_checksum(source.tensor)
            buffer.ready(slot)
            return checksums

    async def _call(self, channel: SyncChannel, request, expected: dict[str, int] | None) -> BucketAck:
        label = request_label(request)
        # send -> ack: the transfer and the receiver's load (it acknowledges after loading)
        with tracer.span("sync.transfer", peer=channel.name, request=label):
            ack = await channel.call(request, self.timeout_s)
        tracer.event("sync.ack", peer=channel.name, request=label, ok=ack.ok)
        if not ack.ok:
            raise SyncError(f"{channel.name} failed {label}: {ack.error or 'no reason given'}")
        bucket_id = request.meta.bucket_id if isinstance(request, SyncBucket) else NO_ID
        sync_id = request.meta.sync_id if isinstance(request, SyncBucket) else request.sync_id
        if (ack.sync_id, ack.bucket_id) != (sync_id, bucket_id):
            raise SyncError(
                f"{channel.name} answered {label} with an ack for sync {ack.sync_id} bucket {ack.bucket_id}"
            )
        if expected:
            _compare_checksums(channel.name, label, expected, ack.checksums or {})
            tracer.event("sync.verified", peer=channel.name, request=label, tensors=len(expected))
        return ack

    def _ensure_buffer(self, slot_bytes: int) -> SenderBuffer:
        buffer = self._buffer
        if buffer is not None and buffer.slot_bytes >= slot_bytes and buffer.num_slots == self.num_buffers:
            return buffer
        self.close()
        self._buffer = create_buffer(
            self.transport, align_up(slot_bytes), self.num_buffers, self.device, self.timeout_s
        )
        return self._buffer


def _announce(named_tensors) -> tuple[Iterable, int, int, int]:
    """Counts for SyncBegin: (tensors, num_tensors, total_bytes, packed_bytes); -1 when streamed."""
    if not isinstance(named_tensors, collections.abc.Sized) or isinstance(named_tensors, collections.abc.Iterator):
        return named_tensors, -1, -1, -1
    items = list(named_tensors)
    sizes = [t.numel() * t.element_size() for _, t in items]
    return items, len(items), sum(sizes), sum(align_up(n) for n in sizes)


async def _settle(tasks: list[asyncio.Task]) -> None:
    """Wait for every receiver's ack of one bucket; raise the first failure."""
    if not tasks:
        return
    if all(task.done() for task in tasks):  # the usual case in a pipeline: no trip through the event loop
        results = [_outcome(task) for task in tasks]
    else:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _outcome(task: asyncio.Task):
    """A finished task's result or exception, as ``gather(..., return_exceptions=True)`` gives it."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


def _forget_finished(bucket: Bucket, pending: dict[str, _Source]) -> None:
    for c in bucket.chunks:
        if c.chunk_start + c.nbytes == c.total_nbytes:
            del pending[c.name]


def _compare_checksums(peer: str, label: str, expected: dict[str, int], got: dict[str, int]) -> None:
    for name, value in expected.items():
        if name not in got:
            raise SyncError(f"{peer} reported no checksum for tensor {name!r} in {label}")
        if got[name] != value:
            raise SyncError(
                f"checksum mismatch for tensor {name!r} on {peer} ({label}): "
                f"sender {value:#010x}, receiver {got[name]:#010x}"
            )
