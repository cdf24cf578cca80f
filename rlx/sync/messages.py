"""Wire messages of weight sync, as msgspec structs encoded with msgpack (never pickle).

Requests on the control channel are a tagged union (``SyncRequest``) so one decoder reads any of
them; each carries ``version`` and a receiver rejects a version it does not speak, naming both.
Replies are always a ``BucketAck`` (``ok=False`` with ``error`` for anything that went wrong,
including a message that could not be decoded). Bulk bytes never travel here: they sit in the
transport's shared buffer or travel by broadcast, and ``BucketMeta`` says where they go.
"""

from __future__ import annotations

import msgspec

PROTOCOL_VERSION = 1
NO_ID = -1  # sync_id / bucket_id of a reply to a request that could not be decoded


class TensorChunk(msgspec.Struct, array_like=True):
    """One tensor, or one piece of a tensor larger than a slot, placed in a slot."""

    name: str
    dtype: str  # torch dtype without the "torch." prefix, e.g. "bfloat16"
    shape: list[int]
    offset: int  # byte offset in the slot (aligned)
    nbytes: int  # bytes of this chunk
    chunk_start: int  # byte offset of this chunk within the full tensor (0 unless split)
    total_nbytes: int  # bytes of the full tensor


class BucketMeta(msgspec.Struct):
    sync_id: int
    bucket_id: int
    slot: int
    chunks: list[TensorChunk]
    is_last: bool
    checksums: dict[str, int] | None = None  # of complete tensors finishing in this bucket


class TransportHandle(msgspec.Struct):
    """What a receiver needs to map the sender's buffer: the kind and a kind-specific payload."""

    kind: str  # "shm", "cuda_ipc", "gloo" or "nccl"
    slot_bytes: int
    num_slots: int
    payload: dict  # shm: {"name", "size"}; cuda_ipc: device uuid + torch's IPC fields (bytes);
    # gloo / nccl: the sender's store (host, port), group name, this receiver's rank, world_size, timeout_s


class BucketAck(msgspec.Struct):
    sync_id: int
    bucket_id: int
    ok: bool
    error: str = ""
    checksums: dict[str, int] | None = None  # of the tensors the receiver loaded from the bucket
    in_sync: bool = False  # a sync is still open on the receiver after this request
    completed: bool = False  # this request (a SyncEnd) completed a sync: the engine holds the new weights


class SyncBegin(msgspec.Struct, tag="begin"):
    sync_id: int
    handle: TransportHandle
    num_tensors: int  # -1 when the sender streams tensors and does not know in advance
    total_bytes: int  # -1 likewise
    verify: bool
    version: int = PROTOCOL_VERSION


class SyncBucket(msgspec.Struct, tag="bucket"):
    meta: BucketMeta
    version: int = PROTOCOL_VERSION


class SyncEnd(msgspec.Struct, tag="end"):
    sync_id: int
    version: int = PROTOCOL_VERSION


class SyncPing(msgspec.Struct, tag="ping"):
    """Liveness probe; answered with ``BucketAck(NO_ID, NO_ID, ok=True)``."""

    version: int = PROTOCOL_VERSION


class SyncAbort(msgspec.Struct, tag="abort"):
    """Drop the sync in progress, if any (its sender went silent); answered ok. Sent by a host
    (the rollout server's watchdog), never by a sender."""

    reason: str
    version: int = PROTOCOL_VERSION


class SyncPlainBroadcast(msgspec.Struct, tag="plain_broadcast"):
    """Bench only (``rlx bench-sync``'s ceiling for ``gloo`` / ``nccl``): between SyncBegin and SyncEnd,
    receive one plain broadcast of each of ``sizes`` bytes over the sync's group into destinations
    allocated beforehand, then acknowledge; no buckets, no consumer."""

    sync_id: int
    sizes: list[int]
    version: int = PROTOCOL_VERSION


SyncRequest = SyncBegin | SyncBucket | SyncEnd | SyncPing | SyncAbort | SyncPlainBroadcast

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(SyncRequest)
_ack_decoder = msgspec.msgpack.Decoder(BucketAck)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes) -> SyncRequest:
    """Decode a request; raises ``msgspec.DecodeError``/``ValidationError`` on anything else."""
    return _request_decoder.decode(data)


def decode_ack(data: bytes) -> BucketAck:
    return _ack_decoder.decode(data)


def request_label(request: msgspec.Struct) -> str:
    """A short description of a request for error messages: 'bucket 3 of sync 7'."""
    if isinstance(request, SyncBucket):
        return f"bucket {request.meta.bucket_id} of sync {request.meta.sync_id}"
    if isinstance(request, (SyncBegin, SyncEnd, SyncPlainBroadcast)):
        return f"{type(request).__name__} of sync {request.sync_id}"
    return type(request).__name__
