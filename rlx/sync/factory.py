"""The one place that decides how a sync moves its bytes: transport, weight arena (zero-copy), sender.

Used by the trainer's controller (``rlx.orchestrator.controller``) and by ``rlx bench-sync``
(``rlx.bench.sync``). The rules:

* transport ``auto``: ``rlx.placement.choose_transport``, the one decision of it -- a broadcast (``nccl`` on a
  GPU, ``gloo`` on the CPU) when any receiver is on another host (one sync uses one transport, and the group
  reaches local receivers too), else the device's shared memory (``cuda_ipc`` / ``shm``); a named transport
  is taken as it is;
* zero-copy: the trainer's weights move into a ``WeightArena`` (the transport's shared buffer) when
  ``sync.zero_copy`` is on, the transport is the device's shared memory, and the caller hands a
  module whose tensors are sent as they are (one rank, the engine's dtype);
  otherwise syncs copy through the sender's slots.

Left out: what the transports do (``transports/``) and how a sync runs (``sender.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rlx.sync.transports import TRANSPORTS

if TYPE_CHECKING:
    import torch

    from rlx.config.sync import SyncConfig
    from rlx.sync.arena import WeightArena
    from rlx.sync.sender import WeightSender


def shared_transport(device: str) -> str:
    """The transport whose buffer receivers on this host read in place: ``cuda_ipc`` or ``shm``."""
    return "cuda_ipc" if device.startswith("cuda") else "shm"


def pick_transport(kind: str, device: str, peers: Sequence[str] = ()) -> str:
    """``kind`` (``sync.transport``) made concrete for a sender on ``device`` reaching ``peers``
    (receiver addresses)."""
    from rlx.net import is_loopback_address
    from rlx.placement import choose_transport

    if kind != "auto" and kind not in TRANSPORTS:
        raise ValueError(f"unknown weight transport {kind!r}; choose one of auto, {', '.join(TRANSPORTS)}")
    return choose_transport(kind, device, remote=not all(is_loopback_address(a) for a in peers))


def make_sender(
    cfg: SyncConfig,
    device: str,
    peers: Sequence[str] = (),
    module: torch.nn.Module | None = None,
    arena: WeightArena | None = None,
) -> WeightSender:
    """A ``WeightSender`` configured by ``cfg`` (an ``rlx.config.sync.SyncConfig``) on ``device``.

    ``module``: the trainer's model when its tensors are sent as they are; with zero-copy possible
    its parameters are adopted into a new arena (``sender.arena``; the caller closes it). ``arena``:
    one the caller built already (the bench's, ``arena_for``)."""
    from rlx.sync.sender import WeightSender

    transport = pick_transport(cfg.transport, device, peers)
    if arena is None and module is not None and cfg.zero_copy and transport == shared_transport(device):
        from rlx.sync.arena import WeightArena

        arena = WeightArena.adopt(module)
    return WeightSender(transport, cfg.bucket_mb, cfg.num_buffers, cfg.timeout_s, cfg.verify, device, arena)


def arena_for(
    transport: str, device: str, tensors: Iterable[tuple[str, torch.Tensor]]
) -> tuple[WeightArena, list[tuple[str, torch.Tensor]]] | tuple[None, None]:
    """An arena holding copies of ``tensors``, and those copies, when ``transport`` is the device's
    shared memory (the bench's zero-copy source); ``(None, None)`` otherwise."""
    if transport != shared_transport(device):
        return None, None
    from rlx.sync.arena import WeightArena

    tensors = list(tensors)
    arena = WeightArena.sized_for((t for _, t in tensors), device)
    return arena, arena.place_all(tensors)
