"""The ``sync`` section: trainer -> rollout weight transfer."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.config.checks import check_choice, check_range

TRANSPORT_CHOICES = ("auto", "shm", "cuda_ipc", "gloo", "nccl")


@dataclass
class SyncConfig:
    transport: str = "auto"
    """Weight transport to the rollout engines: auto, shm (shared memory, CPU), cuda_ipc (same GPU host), gloo / nccl
    (torch.distributed broadcast, across hosts; auto picks it when a server is on another host)."""
    bucket_mb: int = 64
    """Transfer bucket size in MiB."""
    num_buffers: int = 2
    """Buckets in flight: 2 = double buffering (fill k+1 while k loads), 1 = lock-step."""
    timeout_s: float = 120.0
    """Deadline for each bucket's acknowledgement."""
    verify: bool = False
    """Check per-tensor checksums after every sync (proves the engine holds the trainer's bytes)."""
    zero_copy: bool = True
    """One trainer rank: keep its weights in the transport's shared buffer (shm or CUDA IPC) so a sync sends offsets
    and each engine copies once (needs model.rollout_dtype = model.dtype; otherwise syncs copy through the buckets)."""

    def __post_init__(self) -> None:
        check_choice("sync.transport", self.transport, TRANSPORT_CHOICES)
        check_range("sync.bucket_mb", self.bucket_mb, 1, hint="set sync.bucket_mb to the transfer bucket size in MiB")
        check_range("sync.num_buffers", self.num_buffers, 1, 8)
        check_range("sync.timeout_s", self.timeout_s, 0.1)
