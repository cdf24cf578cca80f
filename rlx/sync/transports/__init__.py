"""Transports by name: ``shm`` (POSIX shared memory, CPU), ``cuda_ipc`` (one GPU host), and
``gloo`` / ``nccl`` (a torch.distributed broadcast, across hosts; ``dist.py``).

Each implementation is imported inside its factory branch, so using ``shm`` never touches CUDA
or torch.distributed. Which transport a sync uses is decided in ``rlx.sync.factory``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.sync.messages import TransportHandle
    from rlx.sync.transports.base import ReceiverMapping, SenderBuffer

TRANSPORTS = ("shm", "cuda_ipc", "gloo", "nccl")
SHARED_TRANSPORTS = ("shm", "cuda_ipc")  # one host: receivers read the sender's memory in place


def create_buffer(
    kind: str, slot_bytes: int, num_slots: int, device: str = "cpu", timeout_s: float = 120.0
) -> SenderBuffer:
    if kind == "shm":
        from rlx.sync.transports.shm import ShmBuffer

        return ShmBuffer(slot_bytes, num_slots)
    if kind == "cuda_ipc":
        from rlx.sync.transports.cuda_ipc import CudaIpcBuffer

        return CudaIpcBuffer(slot_bytes, num_slots, device)
    if kind in ("gloo", "nccl"):
        from rlx.sync.transports.dist import DistBuffer

        return DistBuffer(kind, slot_bytes, num_slots, device, timeout_s)
    raise ValueError(f"unknown weight transport {kind!r}; choose one of {', '.join(TRANSPORTS)}")


def map_buffer(handle: TransportHandle) -> ReceiverMapping:
    if handle.kind == "shm":
        from rlx.sync.transports.shm import ShmMapping

        return ShmMapping(handle)
    if handle.kind == "cuda_ipc":
        from rlx.sync.transports.cuda_ipc import CudaIpcMapping

        return CudaIpcMapping(handle)
    if handle.kind in ("gloo", "nccl"):
        from rlx.sync.transports.dist import DistMapping

        return DistMapping(handle)
    raise ValueError(
        f"unknown weight transport {handle.kind!r} in a sync handle; this receiver speaks {', '.join(TRANSPORTS)}"
    )


def group_key(handle: TransportHandle) -> tuple[str, int, str] | None:
    """For a broadcast transport (``gloo`` / ``nccl``): its sender's store address and its group's name, which a
    receiver keeps the group by between syncs; ``None`` for the others."""
    if handle.kind not in ("gloo", "nccl"):
        return None
    p = handle.payload
    return (str(p.get("host")), int(p.get("port", 0)), str(p.get("group")))
