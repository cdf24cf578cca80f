"""The receiving side of a weight update: a sync request's bytes in, a ``BucketAck`` out.

Every host of a receiver -- the vLLM worker extension (``rlx.rollout.backends.vllm``), the ``hf``
backend and the bench's receiver process (``receiver_process``) -- hands the bytes of each sync
request, exactly as the sender encoded them, to one ``SyncHandler``, with a ``Consumer`` that says
what loading means there. Two layers, top to bottom in this module:

``SyncHandler`` decodes and dispatches each request, and owns the one error path::

    SyncBegin   receiver.begin (map the buffer), consumer.begin()
    SyncBucket  receiver.tensors -> consumer.load(tensors) -> receiver.ack (process-then-ack)
    SyncEnd     consumer.end(), receiver.end (release every mapping) -> ack(completed=True)
    SyncAbort   drop the sync in progress (a host whose sender went silent)
    SyncPing    ok

Whatever fails -- an undecodable request, another protocol version, a begin that cannot map its
buffer, a bucket the consumer cannot load, an end that finds tensors missing -- aborts the sync in
progress (``consumer.abort()``, then every view and mapping released) and is answered with an error
ack naming the receiver, the request and the cause. The handler never raises, so a host stays able
to serve and to take the next sync. A request naming a sync other than the one in progress (a late
message of an aborted sync) is refused and changes nothing. Every ack says whether a sync is still
open (``in_sync``), so a host knows when to pause and resume.

``WeightReceiver`` maps the sender's buffer and hands out each bucket's tensors. Every chunk is
checked against the slot bounds, its dtype and its tensor's size before any byte is read, and split
tensors must arrive in order; a bad bucket raises ``ValueError`` (the handler's error path). ``end``
fails when tensors are incomplete, when fewer tensors arrived than announced, or when the consumer
still holds views into the buffer. A resident buffer (``rlx.sync.arena``, the trainer's weights in
shared memory) stays mapped from one sync to the next; its views are dropped all the same.

Left out: sockets (each host has its own wire), threads (a host calls in from one at a time) and
what loading means (the consumer).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import NamedTuple

import msgspec
import torch

from rlx.sync.checksum import tensor_checksum
from rlx.sync.dtypes import dtype_from_name
from rlx.sync.messages import (
    NO_ID,
    PROTOCOL_VERSION,
    BucketAck,
    BucketMeta,
    SyncAbort,
    SyncBegin,
    SyncBucket,
    SyncEnd,
    SyncPing,
    SyncPlainBroadcast,
    TensorChunk,
    decode_request,
    encode,
    request_label,
)
from rlx.sync.transports import group_key, map_buffer
from rlx.sync.transports.base import ReceiverMapping

log = logging.getLogger(__name__)

AssembleInto = Callable[[str, torch.dtype, list[int], torch.device], "torch.Tensor | None"]
Tensors = list[tuple[str, torch.Tensor]]


class Consumer:
    """What loading means for one host; ``load`` is required, the hooks default to nothing."""

    def begin(self) -> None:
        """The buffer is mapped and the first bucket comes next (vLLM: start a layerwise reload)."""

    def load(self, tensors: Tensors, verify: bool) -> dict[str, int] | None:
        """Load ``tensors`` (views into the buffer, valid until this returns); with ``verify``,
        return checksums of what was loaded, or ``None`` to let the receiver checksum the views."""
        raise NotImplementedError

    def end(self) -> None:
        """Every bucket is loaded, before the buffer is released (vLLM: post-processing)."""

    def abort(self) -> None:
        """The sync in progress is dropped: leave the engine able to generate. Called for any
        failure, also when ``begin`` never ran; must be safe to call twice."""


class SyncHandler:
    """One receiver's syncs, dispatched once (the table above); ``handle`` never raises."""

    def __init__(self, receiver: WeightReceiver, consumer: Consumer):
        self.receiver, self.consumer = receiver, consumer
        self.name = receiver.name
        self._sync_id: int | None = None  # the sync in progress
        self._plain: list[torch.Tensor] | None = None  # the bench's plain-broadcast destinations

    @property
    def in_sync(self) -> bool:
        return self._sync_id is not None

    def handle_bytes(self, data: bytes) -> bytes:
        """``handle`` for hosts whose wire carries bytes both ways."""
        return encode(self.handle(data))

    def handle(self, data: bytes) -> BucketAck:
        """Decode and serve one request; never raises."""
        try:
            request = decode_request(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:  # too deep: RecursionError
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            return self._failed(NO_ID, NO_ID, "a sync request", f"malformed sync request: {reason}")
        sync_id = request.meta.sync_id if isinstance(request, SyncBucket) else getattr(request, "sync_id", NO_ID)
        bucket_id = request.meta.bucket_id if isinstance(request, SyncBucket) else NO_ID
        label = request_label(request)
        if request.version != PROTOCOL_VERSION:
            return self._failed(
                sync_id,
                bucket_id,
                label,
                f"sync protocol version {request.version} from the "
                f"sender, this receiver speaks {PROTOCOL_VERSION}; run the same rlx version on both sides",
            )
        if isinstance(request, (SyncBucket, SyncEnd, SyncPlainBroadcast)) and sync_id != self._sync_id:
            return BucketAck(
                sync_id,
                bucket_id,
                ok=False,
                in_sync=self.in_sync,
                error=f"{self.name}: {label} arrived, but the sync in progress is {self._sync_id} "
                "(a message of a sync that was aborted or is over; start a new sync)",
            )
        try:
            return self._dispatch(request)
        except Exception as exc:  # noqa: BLE001 - one error path for every failure, below
            cause = f"{type(exc).__name__}: {exc}"
        # outside the except block: the traceback, and the buffer views in its frames, are gone
        return self._failed(sync_id, bucket_id, label, cause)

    def _dispatch(self, request) -> BucketAck:
        if isinstance(request, SyncBucket):
            return self._bucket(request)
        if isinstance(request, SyncBegin):
            if self._sync_id is not None:
                self._abort(f"sync {request.sync_id} began before sync {self._sync_id} ended")
            self._sync_id = request.sync_id  # from here on a failure aborts this sync
            self.receiver.begin(request)
            self.consumer.begin()
            return BucketAck(request.sync_id, NO_ID, ok=True, in_sync=True)
        if isinstance(request, SyncEnd):
            self.consumer.end()
            ack = self.receiver.end(request)
            if not ack.ok:
                return self._failed(request.sync_id, NO_ID, request_label(request), ack.error, named=True)
            self._sync_id = None
            return BucketAck(request.sync_id, NO_ID, ok=True, completed=True)
        if isinstance(request, SyncAbort):
            if self._sync_id is not None:
                self._abort(request.reason)
            return BucketAck(NO_ID, NO_ID, ok=True)
        if isinstance(request, SyncPlainBroadcast):
            self._plain_broadcast(request)
            return BucketAck(request.sync_id, NO_ID, ok=True, in_sync=True)
        assert isinstance(request, SyncPing), request
        return BucketAck(NO_ID, NO_ID, ok=True, in_sync=self.in_sync)

    def _bucket(self, request: SyncBucket) -> BucketAck:
        meta = request.meta
        tensors = self.receiver.tensors(meta)
        loaded = self.consumer.load(tensors, self.receiver.verifying)
        del tensors  # the receiver's ack checks that no view of the slot is left
        ack = self.receiver.ack(meta, loaded)
        ack.in_sync = True
        return ack

    def _plain_broadcast(self, request: SyncPlainBroadcast) -> None:
        """The bench's ceiling: the same bytes as plain broadcasts into destinations kept from the last time."""
        mapping = self.receiver.mapping
        if mapping is None or not mapping.moves_bytes:
            raise ValueError("a plain broadcast needs a gloo / nccl sync in progress")
        if self._plain is None or [t.numel() for t in self._plain] != request.sizes:
            self._plain = [torch.zeros(n, dtype=torch.uint8, device=mapping.device) for n in request.sizes]
        mapping.fetch_each(self._plain)

    def _failed(self, sync_id: int, bucket_id: int, label: str, cause: str, named: bool = False) -> BucketAck:
        """The one error path: abort the sync in progress and say why."""
        error = cause if named else f"{self.name}: {label} failed: {cause}"
        log.warning("%s", error)
        problem = self._abort(error) if self._sync_id is not None else ""
        return BucketAck(sync_id, bucket_id, ok=False, error=error + problem)

    def _abort(self, why: str) -> str:
        """Drop the sync in progress: the consumer's abort, then every view and mapping. Returns a
        note for the error reply when releasing failed too (the next begin maps afresh either way)."""
        log.info("%s: aborting sync %s: %s", self.name, self._sync_id, why)
        self._sync_id = None
        problems = []
        for step in (self.consumer.abort, self.receiver.abort):
            try:
                step()
            except Exception as exc:  # reported, and the other step still runs
                log.exception("%s: %s failed while aborting a sync", self.name, getattr(step, "__qualname__", step))
                problems.append(f"{type(exc).__name__}: {exc}")
        return f" (while aborting: {'; '.join(problems)})" if problems else ""

    def close(self) -> None:
        """The host is shutting down: abort a sync in progress and unmap everything."""
        if self._sync_id is not None:
            self._abort("the receiver is closing")
        self.receiver.close()


def merge_acks(acks: list[BucketAck]) -> BucketAck:
    """One ack for a host with several workers that each load every bucket (tensor parallel): the
    first failure, else the first ack; a sync is open while any worker has it open."""
    failed = [a for a in acks if not a.ok]
    merged = failed[0] if failed else acks[0]
    merged.in_sync = any(a.in_sync for a in acks)
    return merged


class _Partial(NamedTuple):
    tensor: torch.Tensor
    flat: torch.Tensor  # uint8 view of ``tensor``
    received: int


KEPT_GROUPS = 4  # broadcast groups of different senders a receiver keeps between syncs (least recently used goes)


class WeightReceiver:
    """One receiver of one sender's syncs.

    ``assemble_into(name, dtype, shape, device)`` may return a contiguous tensor of that dtype,
    shape and device (e.g. the parameter itself, when it takes the bytes as they are) for a split
    tensor to be assembled in place; ``tensors()`` then returns that very tensor, saving one copy. Returning
    ``None`` (or passing no callable) assembles into a fresh tensor. With a transport that moves
    bytes (``gloo`` / ``nccl``) every tensor it names a destination for is received straight into
    it, so the consumer finds its bytes already in place.
    """

    def __init__(self, name: str = "receiver", assemble_into: AssembleInto | None = None):
        self.name = name
        self._assemble_into = assemble_into
        self._mapping: ReceiverMapping | None = None  # the buffer of the sync in progress
        self._resident: ReceiverMapping | None = None  # a sender's arena, kept mapped across syncs
        self._groups: dict[tuple, ReceiverMapping] = {}  # broadcast groups kept across syncs, by group_key
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
        """The kept mapping when ``req`` names the arena mapped before, or a broadcast group this receiver
        holds; else a new mapping, which replaces the kept one when it is an arena too (a new group replaces
        the groups of the same sender, which it no longer uses)."""
        if self._resident is not None and self._resident.handle == req.handle:
            return self._resident
        key = group_key(req.handle)
        if key is not None:
            kept = self._groups.get(key)
            if kept is not None and kept.handle.payload.get("rank") == req.handle.payload.get("rank"):
                self._groups[key] = self._groups.pop(key)  # the most recently used goes last
                return kept
            mapping = map_buffer(req.handle)
            for old in [k for k in self._groups if k[:2] == key[:2]]:  # the same sender's older groups
                self._groups.pop(old).close()
            while len(self._groups) >= KEPT_GROUPS:  # other senders': the least recently used goes
                self._groups.pop(next(iter(self._groups))).close()
            self._groups[key] = mapping
            return mapping
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
            raise ValueError(
                f"ack for bucket {meta.bucket_id} of sync {meta.sync_id}, but the tensors handed out "
                f"were of {self._bucket and self._bucket[:2]}; call tensors(meta) first"
            )
        checksums = None
        if self._sync.verify:
            checksums = (
                loaded_checksums
                if loaded_checksums is not None
                else {name: tensor_checksum(t) for name, t in self._views}
            )
        self._mapping.done_reading(meta.slot)
        self._views, self._bucket = [], None
        return BucketAck(meta.sync_id, meta.bucket_id, ok=True, checksums=checksums)

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

    def abort(self) -> None:
        """A failed sync: drop its state and unmap everything, but keep other senders' broadcast groups (one
        sender's failure leaves theirs intact; the failed sync's own group goes)."""
        self._drop(keep={key: group for key, group in self._groups.items() if group is not self._mapping})

    def close(self) -> None:
        """Drop all state and unmap (the host is shutting down)."""
        self._drop(keep={})

    def _drop(self, keep: dict[tuple, ReceiverMapping]) -> None:
        self._reset_sync()
        self._sync = None
        self._release_mapping()
        if self._resident is not None:
            self._resident.close()
            self._resident = None
        dropped = [group for key, group in self._groups.items() if key not in keep]
        self._groups = keep
        for group in dropped:
            group.close()

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
        raw = self._mapping.slot(slot)[chunk.offset : chunk.offset + chunk.nbytes]
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
            raise ValueError(
                f"chunk of tensor {chunk.name!r} at byte {chunk.chunk_start} arrived out of order "
                f"(expected byte {partial.received})"
            )
        land = partial.flat[chunk.chunk_start : chunk.chunk_start + chunk.nbytes]
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
        if (
            target.dtype != dtype
            or list(target.shape) != chunk.shape
            or target.device != device
            or not target.is_contiguous()
        ):
            raise ValueError(
                f"assemble_into gave {tuple(target.shape)} {target.dtype} on {target.device} for tensor "
                f"{chunk.name!r}, which needs a contiguous {tuple(chunk.shape)} {dtype} on {device}"
            )
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
        raise ValueError(
            f"sync protocol version {version} from the sender, this receiver speaks "
            f"{PROTOCOL_VERSION}; run the same rlx version on both sides"
        )


def _check_chunk(chunk: TensorChunk, slot_bytes: int) -> torch.dtype:
    dtype = dtype_from_name(chunk.dtype)
    itemsize = dtype.itemsize
    expected = math.prod(chunk.shape) * itemsize
    if chunk.total_nbytes != expected or min(chunk.shape, default=0) < 0:
        raise ValueError(
            f"tensor {chunk.name!r}: shape {chunk.shape} of {chunk.dtype} is {expected} bytes, "
            f"the chunk says {chunk.total_nbytes}"
        )
    if chunk.offset < 0 or chunk.nbytes < 0 or chunk.offset + chunk.nbytes > slot_bytes or chunk.offset % itemsize:
        raise ValueError(
            f"tensor {chunk.name!r}: bytes [{chunk.offset}, {chunk.offset + chunk.nbytes}) are not an "
            f"aligned range of a {slot_bytes}-byte slot"
        )
    if chunk.chunk_start < 0 or chunk.chunk_start + chunk.nbytes > chunk.total_nbytes:
        raise ValueError(
            f"tensor {chunk.name!r}: chunk [{chunk.chunk_start}, +{chunk.nbytes}) lies outside its "
            f"{chunk.total_nbytes} bytes"
        )
    return dtype
