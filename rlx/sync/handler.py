"""The receiving side of a weight update, dispatched once: request bytes in, ``BucketAck`` out.

Every host of a receiver runs its syncs through one ``SyncHandler``: the bench's receiver process
(``receiver_process``), the vLLM worker extension (``rlx.rollout.backends.vllm_worker``) and the
``hf`` backend. The host hands over the bytes of each sync request exactly as the sender encoded
them, and a ``Consumer`` says what loading means there::

    SyncBegin   receiver.begin (map the buffer), consumer.begin()
    SyncBucket  receiver.tensors -> consumer.load(tensors) -> receiver.ack (process-then-ack)
    SyncEnd     consumer.end(), receiver.end (release every mapping) -> ack(completed=True)
    SyncAbort   drop the sync in progress (a host whose sender went silent)
    SyncPing    ok

One error path: whatever fails -- an undecodable request, another protocol version, a begin that
cannot map its buffer, a bucket the consumer cannot load, an end that finds tensors missing --
aborts the sync in progress (``consumer.abort()``, then every view and mapping released) and is
answered with an error ack naming the receiver, the request and the cause. The handler never
raises, so a host stays able to serve and to take the next sync. A request naming a sync other
than the one in progress (a late message of an aborted sync) is refused and changes nothing.
Every ack says whether a sync is still open (``in_sync``), so a host knows when to pause and resume.

Left out: sockets (each host has its own wire) and threads (a host calls in from one at a time).
"""

from __future__ import annotations

import logging

import msgspec
import torch

from rlx.sync.messages import (
    NO_ID,
    PROTOCOL_VERSION,
    BucketAck,
    SyncAbort,
    SyncBegin,
    SyncBucket,
    SyncEnd,
    SyncPing,
    SyncPlainBroadcast,
    decode_request,
    encode,
    request_label,
)
from rlx.sync.receiver import WeightReceiver

log = logging.getLogger(__name__)

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
            return self._failed(sync_id, bucket_id, label, f"sync protocol version {request.version} from the "
                                f"sender, this receiver speaks {PROTOCOL_VERSION}; run the same rlx version on both sides")
        if isinstance(request, (SyncBucket, SyncEnd, SyncPlainBroadcast)) and sync_id != self._sync_id:
            return BucketAck(sync_id, bucket_id, ok=False, in_sync=self.in_sync,
                             error=f"{self.name}: {label} arrived, but the sync in progress is {self._sync_id} "
                                   "(a message of a sync that was aborted or is over; start a new sync)")
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
        mapping.fetch(0, [(0, dst) for dst in self._plain])

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
        for step in (self.consumer.abort, self.receiver.close):
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
