"""CUDA IPC transport (processes on one GPU host): one device buffer, opened by receivers.

The sender allocates the slots as one CUDA tensor and exports it with torch's own IPC machinery
(``UntypedStorage._share_cuda_``); the eight fields it returns travel as plain msgpack fields
(ints, bytes, bool), never pickled, and a receiver rebuilds the storage with
``UntypedStorage._new_shared_cuda``. The receiver finds its local index of the GPU by UUID, so
sender and receiver may see different ``CUDA_VISIBLE_DEVICES``; a receiver on another GPU of the host
opens the buffer as long as it sees the sender's GPU too (peer-to-peer: the launcher appends the trainer's
GPU to a separate engine's ``CUDA_VISIBLE_DEVICES``, after the engine's own).

Ordering: the sender synchronises its stream before a bucket's meta is sent (``ready``), and a
receiver synchronises the device before it acknowledges a bucket (``done_reading``), so an
asynchronous copy still reading a slot can never race the sender's next write into it.

Lifetime: torch counts IPC references in a small shared file and keeps a freed block whose count
is above zero in a "limbo" until it drops. The buffer is exported once (count 1) and every
receiver decrements the count when it drops its mapping at each ``SyncEnd``, so the count is at
or below zero once a sync has ended and the memory is never reused while a receiver maps it.
Known issue: on torch 2.11 a closed sender's buffer was seen to stay allocated in the sender
process (the counts were checked and are right); it is one buffer per ``WeightSender``, which
lives for the whole run. Expandable segments
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) are not supported by CUDA IPC in torch.
"""

from __future__ import annotations

import torch

from rlx.sync.messages import TransportHandle
from rlx.sync.transports.base import ReceiverMapping, SenderBuffer

_FIELDS = (
    "device",
    "handle",
    "storage_size",
    "storage_offset",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync_required",
)


class CudaIpcBuffer(SenderBuffer):
    def __init__(self, slot_bytes: int, num_slots: int, device: str = "cuda"):
        self.slot_bytes, self.num_slots = slot_bytes, num_slots
        self.device = _cuda_device(device)
        self._buf = torch.empty(slot_bytes * num_slots, dtype=torch.uint8, device=self.device)
        fields = self._buf.untyped_storage()._share_cuda_()
        self._payload = dict(zip(_FIELDS, fields, strict=True))
        self._payload["device_uuid"] = device_uuid(self.device.index)

    def slot(self, index: int) -> torch.Tensor:
        return self._buf[index * self.slot_bytes : (index + 1) * self.slot_bytes]

    def ready(self, index: int) -> None:
        torch.cuda.current_stream(self.device).synchronize()

    def handle(self) -> TransportHandle:
        return TransportHandle("cuda_ipc", self.slot_bytes, self.num_slots, dict(self._payload))

    def close(self) -> None:
        if self._buf is not None:
            torch.cuda.synchronize(self.device)
            self._buf = None
            torch.cuda.ipc_collect()


class CudaIpcMapping(ReceiverMapping):
    def __init__(self, handle: TransportHandle):
        self.handle = handle
        p = handle.payload
        missing = [k for k in (*_FIELDS, "device_uuid") if k not in p]
        if missing:
            raise ValueError(f"cuda_ipc handle lacks {', '.join(missing)}")
        self.device = torch.device("cuda", local_device_index(p["device_uuid"]))
        storage = torch.UntypedStorage._new_shared_cuda(
            self.device.index,
            p["handle"],
            p["storage_size"],
            p["storage_offset"],
            p["ref_counter_handle"],
            p["ref_counter_offset"],
            p["event_handle"],
            p["event_sync_required"],
        )
        if storage.nbytes() < handle.slot_bytes * handle.num_slots:
            raise ValueError(
                f"cuda_ipc buffer holds {storage.nbytes()} bytes, the handle says "
                f"{handle.slot_bytes} x {handle.num_slots}"
            )
        self._weak = storage._weak_ref()
        self._tensor = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)

    def slot(self, index: int) -> torch.Tensor:
        return self._tensor[index * self.handle.slot_bytes : (index + 1) * self.handle.slot_bytes]

    def done_reading(self, index: int) -> None:
        _synchronize_both(self.device)

    def close(self) -> None:
        if self._tensor is None:
            return
        _synchronize_both(self.device)
        self._tensor = None
        if not torch.UntypedStorage._expired(self._weak):
            raise BufferError(
                "tensors over the CUDA IPC buffer are still referenced; drop every view "
                "returned by WeightReceiver.tensors() before the bucket's ack"
            )
        torch.UntypedStorage._free_weak_ref(self._weak)
        self._weak = None


def _synchronize_both(device: torch.device) -> None:
    """The buffer's GPU and this process's own: a consumer on another GPU (peer-to-peer) copies out of the
    buffer on its own device's stream."""
    torch.cuda.synchronize(device)
    if torch.cuda.current_device() != device.index:
        torch.cuda.synchronize(torch.cuda.current_device())


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_device_index(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    raise RuntimeError(
        f"the sender's GPU {uuid} is not visible to this receiver (CUDA_VISIBLE_DEVICES="
        "...); cuda_ipc needs sender and receiver on the same GPU host, sharing that GPU"
    )


def _cuda_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"transport cuda_ipc needs a CUDA device, got device={device!r} "
            f"(CUDA available: {torch.cuda.is_available()}); use transport=shm on CPU"
        )
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
